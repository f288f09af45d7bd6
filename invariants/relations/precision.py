"""StablePrecision: no module silently changes precision from one training iteration to the next.

``{"api": "torch.nn.Module.forward", "prop": "dtype"}`` — "in every training iteration,
a module's training forwards return at least one floating dtype they returned in the
module's previous training iteration".  Broken when mixed precision is silently lost
partway through a run: the ``torch.autocast`` region no longer wraps the forward (a flag
reset after an evaluation pass, a refactored loop), a compiler or custom kernel drops
the autocast transformation, a model is cast to another dtype mid-run (``.half()`` for a
fast evaluation, never undone).  Nothing crashes and the loss keeps falling; the run
gets slower, or loses the precision it was tuned for.

What each module returned last is a run-level baseline (`RunState.precisions`), kept
per model and module path and updated by every training iteration (a window the run
model marks ``trained``: an optimizer step or a hand-written update ended it).  So the
rule speaks of changes, once each: a module first seen later (a layer grown mid-run, a
second model) starts its own baseline, a new model instance is a new model (a sweep that
trains once in float32 and once under autocast), and the setup window and windows
without an update (evaluation, a dry run to build lazy modules) neither judge nor teach.
A module run both ways on purpose (a float32 auxiliary pass next to the autocast one)
changes nothing as long as one of its dtypes stays, and mixed precision switched on
mid-run (a float32 warm-up, then ``torch.autocast``) is a change towards the active
autocast dtype, not a loss: a module whose forwards all return the dtype of the autocast
region they ran in is not judged.  A cast of the weights (``.half()``) runs outside
autocast and stays judged.  Nor is a window where an optimizer takes its first step: a
new phase (a final fine-tuning with a fresh optimizer) may run in another precision.  The baseline is bounded
(`MAX_BASELINE_MODULES` modules per run); modules beyond it are not judged.

No precondition, no context: the rule is about a run against itself, in any precision.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..events import MODULE_FORWARD, OPTIMIZER_STEP
from ..window import FactPlan
from .base import Mode, Site, Template
from .baselines import FIRST_ITERATION_STEP
from .view import WindowView

FAMILY = ("dtype", MODULE_FORWARD)
#: modules whose precision one run remembers (a 70B model has about 1,300 layers)
MAX_BASELINE_MODULES = 8192
#: summaries nested deeper than this (an output tuple inside a tuple) are not searched
_MAX_OUTPUT_DEPTH = 2

Precisions = dict[str, list[str]]


def output_dtype(summary: Any, depth: int = 0) -> str | None:
    """The floating dtype of a forward's output: the tensor's, or the first floating
    tensor's of a tuple (an RNN's output before its hidden state).  None for integer
    outputs (token ids, indices), which no precision setting changes."""
    if isinstance(summary, dict):
        if summary.get("T") != "tensor":
            return None
        dtype = summary.get("dtype")
        return dtype if isinstance(dtype, str) and ("float" in dtype or "half" in dtype) else None
    if isinstance(summary, list) and depth < _MAX_OUTPUT_DEPTH:
        for item in summary:
            found = output_dtype(item, depth + 1)
            if found is not None:
                return found
    return None


def module_key(call: Mapping[str, Any]) -> str | None:
    """``model id|path``: one module of one model instance; a forward outside any
    model (a loss module called on its own) is known by its type instead."""
    path = call.get("module")
    if not isinstance(path, str):
        return None
    root = call.get("obj")
    return f"{root if isinstance(root, str) else call.get('mtype', '')}|{path}"


def training_precisions(view: WindowView, rank: int) -> dict[str, set[str]]:
    """module key -> the floating dtypes its training forwards returned on one rank, in
    a training iteration (nothing for any other window).  Computed once per window and
    rank: the check and the baseline's update after it read the same map."""
    return _window_precisions(view, rank)[0]


def autocast_outputs(view: WindowView, rank: int) -> set[str]:
    """Module keys whose every training forward in the window returned the dtype of the
    autocast region it ran in: mixed precision switched on (after a float32 warm-up)
    changes their dtype on purpose, and the rule is about precision *lost*."""
    return _window_precisions(view, rank)[1]


def _window_precisions(view: WindowView, rank: int) -> tuple[dict[str, set[str]], set[str]]:
    per_rank = view.derived.setdefault("training_precisions", {})
    found = per_rank.get(rank)
    if found is not None:
        return found
    dtypes_by_key: dict[str, set[str]] = {}
    cast_by_key: dict[str, bool] = {}
    per_rank[rank] = found = (dtypes_by_key, set())
    if view.step < FIRST_ITERATION_STEP or view.facts(rank).trained is not True:
        return found
    for call in view.calls_by_api(rank).get(MODULE_FORWARD, ()):
        if call.get("training") is not True:
            continue
        ctx = call.get("ctx")
        if not isinstance(ctx, dict) or ctx.get("grad") is not True:
            continue
        dtype = output_dtype(call.get("ret"))
        key = module_key(call) if dtype is not None else None
        if key is not None:
            dtypes_by_key.setdefault(key, set()).add(dtype)  # type: ignore[arg-type]
            cast_by_key[key] = cast_by_key.get(key, True) and ctx.get("autocast") == dtype
    found[1].update(key for key, cast in cast_by_key.items() if cast)
    return found


def learn_precisions(view: WindowView, baseline: Precisions) -> None:
    """Move a run's baseline to this window: each module that trained here is now known
    by what it returned here, on any rank (one rank that changed is reported once)."""
    window: dict[str, set[str]] = {}
    for rank in view.ranks():
        for key, dtypes in training_precisions(view, rank).items():
            window.setdefault(key, set()).update(dtypes)
    for key, dtypes in window.items():
        if key in baseline or len(baseline) < MAX_BASELINE_MODULES:
            baseline[key] = sorted(dtypes)


def _new_optimizer_steps(view: WindowView, rank: int) -> bool:
    """An optimizer steps for the first time here: a new phase of the run (a final
    fine-tuning in float32 with its own optimizer), which may choose its precision."""
    return any(call.get("trained") is False for call in view.calls_by_api(rank).get(OPTIMIZER_STEP, ()))


class StablePrecision(Template):
    relation = "StablePrecision"
    min_support = 3

    def allows_precondition(self, family: tuple) -> bool:
        return False

    def sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        baseline = view.precisions
        if not baseline or not mode.wants(FAMILY):
            return
        checking = mode.checking
        for rank in view.ranks():
            if _new_optimizer_steps(view, rank):
                continue
            switched_on = autocast_outputs(view, rank)
            for key, dtypes in training_precisions(view, rank).items():
                known = baseline.get(key)
                if known is None:
                    continue
                holds = not dtypes.isdisjoint(known) or key in switched_on
                if holds and checking:
                    continue
                root, _, path = key.partition("|")
                yield Site(FAMILY, holds, lambda rank=rank: view.context_free_records(rank), [rank],
                           view.rank_stage(rank),
                           {} if holds else {"module": path or "(the model itself)", "model": root or None,
                                             "dtypes": sorted(dtypes), "previous_iteration": list(known)})

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        return {"api": family[1], "prop": family[0]}

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        if params.get("api") != MODULE_FORWARD:
            raise ValueError("api")
        if params.get("prop") != "dtype":
            raise ValueError("prop")
        return FAMILY, None

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        return FactPlan(apis={MODULE_FORWARD, OPTIMIZER_STEP}, args={}, state_points=set(), state_attrs=set())

    def describe(self, params: Mapping[str, Any]) -> str:
        return ("no module changes precision between training iterations: its training forwards keep returning "
                "a floating dtype they returned in its previous iteration (mixed precision is never silently lost)")

    def hint(self, params: Mapping[str, Any]) -> str:
        return ("the module's precision changed mid-run: the torch.autocast region no longer wraps this forward "
                "(a flag reset after evaluation, a refactored loop), a compiled or custom kernel dropped the "
                "autocast transformation, or the model was cast to another dtype (.half()/.float()) and never "
                "cast back")
