"""Templates about *when* things happen, which the silent-bug catalogue needs (the
mode a call runs in is `training_flag`).

**APIAbsent** — "API X is not called in stage S after step K":
    ``{"api": "torch.nn.init.normal_", "stage": "train", "after_step": 0}``.  Learned for
    one-off APIs (seen in at most two steps of a reference run: initialisation, seeding,
    checkpoint loading) whose stage continues well past their last use.  Catches weights
    re-initialised during training, RNG re-seeded every step.  Also learned for
    training-loop APIs (called in at least half the steps of every reference run) and a
    stage that never sees them, with ``after_step = -1``:
    ``{"api": "torch.optim.Optimizer.step", "stage": "eval", "after_step": -1}`` —
    catches a model left in eval mode after validation (the optimizer then steps while
    the producer reports the eval stage).

    Initialisers and in-place parameter writes (``torch.nn.init.*``,
    ``torch.Tensor.param_overwrite``) say whether their target was already *trained*
    (held by an optimizer that has stepped).  A call on untrained parameters is not a
    site: building and initialising a brand-new model mid-run is not re-initialising
    the trained one.  Calls without the flag (older producers) are judged as before.

**AllRanksReport** — "every rank of the world reports every step": ``{}``.  A rank that
    is missing when a window closes (stalled, crashed, partitioned) is reported with the
    ranks that did report.  The engine checks it on every window it closes.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

from ..events import OPTIMIZER_STEP, WORKER_INIT_API
from ..model import Invariant
from ..window import FactPlan
from .base import Mode, Site, Template
from .view import WindowView

#: Called in DataLoader worker processes: its stage is wherever the loader's iterator
#: was created, which differs between pipelines, so stage rules about it are noise.
WORKER_APIS = frozenset({WORKER_INIT_API})
#: An API called in more distinct steps than this is not a one-off API.
ONE_OFF_MAX_STEPS = 2
#: The stage must go on at least this many steps past the API's last use.
ABSENT_MIN_TAIL = 3


def calls_of(view: WindowView, rank: int, apis: set[str] | None) -> Iterable[dict[str, Any]]:
    """A rank's calls of ``apis`` (None: all of them).  Families are per API, so each
    family sees its calls in emission order either way."""
    if apis is None:
        return view.calls(rank)
    by_api = view.calls_by_api(rank)
    return [call for api in apis if api in by_api for call in by_api[api]]


class APIAbsent(Template):
    relation = "APIAbsent"

    def check_plan(self, families: Any) -> frozenset[str]:
        """The APIs the families are about."""
        return frozenset(f[1] for f in families)

    def sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        checking, families = mode.checking, mode.families
        for rank in view.ranks():
            for call in calls_of(view, rank, mode.plan):  # inferring: no plan, every call
                if call.get("trained") is False:
                    continue  # initialising parameters no optimizer has trained (a new model)
                api = call["api"]
                family = ("absent", api, call.get("stage", ""))
                if checking and family not in families:
                    continue
                yield Site(family, view.step, lambda call=call, rank=rank: [view.call_record(call, rank)],
                           [rank], call.get("stage", ""),
                           lambda call=call: {"call": call["key"], "module": call.get("module"), "args": call.get("args")})

    def holds(self, value: Any, site: Site) -> bool:
        return site.observed <= value

    # inference is not site-by-site: it needs the whole run's step range per stage
    custom_inference = True

    def infer_observe(self, view: WindowView, store: dict[str, Any]) -> None:
        stage_max = store.setdefault("stage_max", {})
        api_steps = store.setdefault("api_steps", {})
        api_stage_max = store.setdefault("api_stage_max", {})
        run_windows = store.setdefault("run_windows", {})
        api_windows = store.setdefault("api_windows", {})
        stage_windows = store.setdefault("stage_windows", {})
        stage_step_windows = store.setdefault("stage_step_windows", {})
        run = view.run
        for rank in view.ranks():
            run_windows[run] = run_windows.get(run, 0) + 1
            stage = view.rank_stage(rank)
            if stage:
                key = (run, stage)
                stage_max[key] = max(stage_max.get(key, -1), view.step)
                per_step = stage_step_windows.setdefault(stage, {})
                per_step[view.step] = per_step.get(view.step, 0) + 1
            apis_here: set[str] = set()
            stages_here: set[str] = set()
            for call in view.calls(rank):
                api, call_stage = call["api"], call.get("stage", "")
                if api in WORKER_APIS:
                    continue
                if call.get("trained") is False and api != OPTIMIZER_STEP:
                    # the API exists in this pipeline, but a call on untrained parameters
                    # (setup, or a brand-new model) is no use of it the rule is about; an
                    # optimizer's first step (also marked) is a training step like any other
                    api_steps.setdefault((run, api), set())
                    continue
                apis_here.add(api)
                stages_here.add(call_stage)
                steps = api_steps.setdefault((run, api), set())
                if len(steps) <= ONE_OFF_MAX_STEPS:
                    steps.add(view.step)
                key = (api, call_stage)
                api_stage_max[key] = max(api_stage_max.get(key, -1), view.step)
                stage_key = (run, call_stage)
                stage_max[stage_key] = max(stage_max.get(stage_key, -1), view.step)
            for api in apis_here:
                api_windows[(run, api)] = api_windows.get((run, api), 0) + 1
            for call_stage in stages_here:
                stage_windows[call_stage] = stage_windows.get(call_stage, 0) + 1

    def infer_finish(self, store: dict[str, Any]) -> list[Invariant]:
        stage_max: dict = store.get("stage_max", {})
        api_steps: dict = store.get("api_steps", {})
        api_stage_max: dict = store.get("api_stage_max", {})
        one_off: dict[str, bool] = {}
        for (run, api), steps in api_steps.items():
            one_off[api] = one_off.get(api, True) and len(steps) <= ONE_OFF_MAX_STEPS
        stages = sorted({stage for (_, stage) in stage_max if stage})
        found: dict[str, Invariant] = {}
        for api in sorted(a for a, ok in one_off.items() if ok):
            for stage in stages:
                last_use = api_stage_max.get((api, stage), -1)
                tails = [m for (run, s), m in stage_max.items() if s == stage]
                if not tails or max(tails) < last_use + ABSENT_MIN_TAIL:
                    continue
                # positive examples: the rank-windows of that stage, in every run, after the last use
                held = sum(n for step, n in store.get("stage_step_windows", {}).get(stage, {}).items()
                           if step > last_use)
                self._add(found, api, stage, last_use, held)
        # training-loop APIs (called in most steps of every run) that a stage never sees:
        # "the optimizer never steps during evaluation"
        run_windows: dict = store.get("run_windows", {})
        api_windows: dict = store.get("api_windows", {})
        stage_windows: dict = store.get("stage_windows", {})
        loop_apis: dict[str, bool] = {}
        for (run, api), count in api_windows.items():
            frequent = count >= ABSENT_MIN_TAIL and 2 * count >= run_windows.get(run, 0)
            loop_apis[api] = loop_apis.get(api, True) and frequent
        for api in sorted(a for a, ok in loop_apis.items() if ok):
            for stage in stages:
                if stage_windows.get(stage, 0) < ABSENT_MIN_TAIL or (api, stage) in api_stage_max:
                    continue
                self._add(found, api, stage, -1, stage_windows[stage])
        return list(found.values())

    def _add(self, found: dict[str, Invariant], api: str, stage: str, after: int, support: int) -> None:
        params = {"api": api, "stage": stage, "after_step": after}
        inv = Invariant(self.relation, params, None, self.describe(params), [api], positive=support, negative=0)
        found[inv.id] = inv

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        return {"api": family[1], "stage": family[2], "after_step": value}

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        after = params["after_step"]
        if not isinstance(after, int) or isinstance(after, bool):
            raise ValueError("after_step")
        return ("absent", str(params["api"]), str(params["stage"])), after

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        return FactPlan(apis={params["api"]}, args={params["api"]: None}, state_points=set(), state_attrs=set())

    def describe(self, params: Mapping[str, Any]) -> str:
        after = params["after_step"]
        when = "at any step" if after < 0 else f"after step {after}"
        return f"{params['api']} is not called in stage {params['stage']!r} {when}"

    def hint(self, params: Mapping[str, Any]) -> str:
        if params["after_step"] < 0 and params["stage"] == "eval":  # a training-loop API in evaluation
            return (f"{params['api']} ran while the model was in {params['stage']} mode: a model.eval() (validation, "
                    "a metric pass) was never undone with model.train(), so dropout and batch-norm statistics are off "
                    "while it trains")
        return (f"{params['api']} ran again mid-{params['stage']}: initialisation or seeding code inside the loop "
                "(e.g. a model/optimizer re-created, weights re-initialised, RNG re-seeded every step)")

    def violation_evidence(self, params: Mapping[str, Any], site: Site) -> dict[str, Any]:
        return dict(site.get_evidence(), step=site.observed)


class AllRanksReport(Template):
    relation = "AllRanksReport"

    custom_inference = True

    def infer_observe(self, view: WindowView, store: dict[str, Any]) -> None:
        store["windows"] = store.get("windows", 0) + 1
        if view.window.missing_ranks():
            store["incomplete"] = store.get("incomplete", 0) + 1

    def infer_finish(self, store: dict[str, Any]) -> list[Invariant]:
        if not store.get("windows") or store.get("incomplete"):
            return []
        return [Invariant(self.relation, {}, None, self.describe({}), [], positive=store["windows"], negative=0)]

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        return {}

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        return ("all_ranks",), None

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        return FactPlan(apis=set(), state_points=set(), state_attrs=set())

    def describe(self, params: Mapping[str, Any]) -> str:
        return "every rank of the job reports the end of every step"

    def hint(self, params: Mapping[str, Any]) -> str:
        return "a rank is stalled, crashed or lost its connection; the others may hang at the next collective"
