"""Templates about *when* things happen, which the silent-bug catalogue needs.

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

**TrainingFlag** — "calls of API X (on modules of type M) run with ``training = F`` in
    stage S" (inference learns only ``training = false`` rules; a frozen submodule kept
    in eval during training is legitimate): ``{"api": "torch.nn.Module.forward", "mtype": "Dropout", "stage": "eval",
    "training": false}``.  Reads the call's ``training`` field, or a boolean
    ``training`` argument (``torch.nn.functional.dropout``).  Catches dropout or batch-norm
    statistics left in training mode during evaluation, and the converse.

    Second form, about a module's *first* forward in the process (the producer marks
    it with ``ctx.first_forward``, see ``producers/module_facts.py``): "the first
    forward of a module whose weight carries the legacy, hook-based spectral norm runs
    in training mode": ``{"api": "torch.nn.Module.forward", "first_forward": true,
    "spectral_norm": "hook", "training": true}``.  That implementation starts from
    random singular-vector estimates and refines them only in training-mode forwards,
    so an evaluation forward that comes first divides the weight by a sigma estimated
    from random vectors (PyTorch issue 51800).  Nothing else about that forward looks
    wrong, which is why the rule needs to know it was the first.  The rule binds in
    every stage, precision and grad mode, so its examples carry no context.  Not sites:
    a layer whose estimate already fits its weight (``ctx.spectral_norm_refined``:
    loaded from a checkpoint, as when a resumed run validates before it trains), and
    the parametrization-based ``spectral_norm``, which refines its estimate when it is
    registered.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

from ..model import Invariant
from ..window import FactPlan
from .base import Site, Template

#: Called in DataLoader worker processes: its stage is wherever the loader's iterator
from .view import WindowView
#: was created, which differs between pipelines, so stage rules about it are noise.
WORKER_APIS = frozenset({"torch.utils.data.worker_init"})
#: Spectral-norm implementations whose estimate is only refined by training-mode forwards.
LAZY_SPECTRAL_NORMS = frozenset({"hook"})
MODULE_FORWARD = "torch.nn.Module.forward"
#: An API called in more distinct steps than this is not a one-off API.
ONE_OFF_MAX_STEPS = 2
#: The stage must go on at least this many steps past the API's last use.
ABSENT_MIN_TAIL = 3


def _calls_of(view: WindowView, rank: int, apis: set[str] | None) -> Iterable[dict[str, Any]]:
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

    def sites(self, view: WindowView, families: Any = None, plan: frozenset[str] | None = None) -> Iterator[Site]:
        wanted = None if families is None else (plan if plan is not None else self.check_plan(families))
        for rank in view.ranks():
            for call in _calls_of(view, rank, wanted):
                if call.get("trained") is False:
                    continue  # initialising parameters no optimizer has trained (a new model)
                api = call["api"]
                family = ("absent", api, call.get("stage", ""))
                if families is not None and family not in families:
                    continue
                yield Site(family, view.step, lambda call=call, rank=rank: [view.call_record(call, rank)],
                           [rank], call.get("stage", ""),
                           lambda call=call: {"call": call["key"], "module": call.get("module"), "args": call.get("args")})

    def holds(self, value: Any, site: Site) -> bool:
        return site.observed <= value

    # inference is not site-by-site: it needs the whole run's step range per stage
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
                if call.get("trained") is False:
                    # the API exists in this pipeline, but a call on untrained parameters
                    # (setup, or a brand-new model) is no use of it the rule is about
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
        return (f"{params['api']} ran again mid-{params['stage']}: initialisation or seeding code inside the loop "
                "(e.g. a model/optimizer re-created, weights re-initialised, RNG re-seeded every step)")

    def violation_evidence(self, params: Mapping[str, Any], site: Site) -> dict[str, Any]:
        return dict(site.get_evidence(), step=site.observed)


class AllRanksReport(Template):
    relation = "AllRanksReport"

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


class TrainingFlag(Template):
    relation = "TrainingFlag"

    def is_value_family(self, family: tuple) -> bool:
        return True

    def allows_precondition(self, family: tuple) -> bool:
        return False

    def keeps_hypothesis(self, params: Mapping[str, Any]) -> bool:
        # "training=True in stage train" breaks on legitimately frozen submodules (a BN
        # stem kept in eval); training-mode-forgotten is APIAbsent's job.  Learn only
        # the evaluation direction.  A first forward is the exception: a lazily
        # estimated spectral norm needs it in training mode, and only that is learnt.
        if params.get("first_forward"):
            return params["training"] is True
        return params["training"] is False

    def check_plan(self, families: Any) -> tuple[bool, frozenset[str]]:
        """Whether a first-forward rule is deployed, and the APIs whose calls the
        deployed rules read."""
        first_wanted = any(f[0] == "first_forward" for f in families)
        apis = {f[1] for f in families if f[0] in ("flag", "no_grad")} | ({MODULE_FORWARD} if first_wanted else set())
        return first_wanted, frozenset(apis)

    def sites(self, view: WindowView, families: Any = None, plan: Any = None) -> Iterator[Site]:
        first_wanted, apis = True, None
        if families is not None:
            first_wanted, apis = plan if plan is not None else self.check_plan(families)
        for rank in view.ranks():
            for call in _calls_of(view, rank, apis):
                api = call["api"]
                if first_wanted and api == MODULE_FORWARD:
                    ctx = call.get("ctx")  # most forwards are not a module's first: skip them here
                    if isinstance(ctx, dict) and ctx.get("first_forward") is True:
                        site = self._first_forward_site(view, call, rank, families)
                        if site is not None:
                            yield site
                flag = call.get("training")
                if not isinstance(flag, bool):
                    args = call.get("args") or {}
                    flag = args.get("training")
                    if not isinstance(flag, bool):
                        continue
                stage = call.get("stage", "")
                families_here = [("flag", api, call.get("mtype") or "", stage)]
                if "dropout" in api and _grad_disabled(call):
                    families_here.append(("no_grad", api))
                for family in families_here:
                    if families is not None and family not in families:
                        continue
                    records = (lambda call=call, rank=rank: [view.call_record(call, rank)]) if family[0] == "flag" else (
                        lambda call=call, rank=rank: [_without_mode(view.call_record(call, rank))])
                    yield Site(family, frozenset([flag]), records, [rank], stage,
                               lambda call=call, flag=flag: {"call": call["key"], "module": call.get("module"),
                                                             "mtype": call.get("mtype"), "training": flag})

    @staticmethod
    def _first_forward_site(view: WindowView, call: dict[str, Any], rank: int, families: Any) -> Site | None:
        ctx = call.get("ctx")
        flag = call.get("training")
        if not isinstance(ctx, dict) or ctx.get("first_forward") is not True or not isinstance(flag, bool):
            return None
        norm = ctx.get("spectral_norm")
        # u/v that already fit the weight (loaded from a checkpoint) make an eval-first
        # forward harmless; unknown counts as unrefined, as for a fresh layer
        if norm not in LAZY_SPECTRAL_NORMS or ctx.get("spectral_norm_refined") is True:
            return None
        family = ("first_forward", MODULE_FORWARD, norm)
        if families is not None and family not in families:
            return None
        records = [{"rank": rank, "step_is_first": view.step == 0}]
        return Site(family, frozenset([flag]), records, [rank], call.get("stage", ""),
                    {"call": call["key"], "module": call.get("module"), "mtype": call.get("mtype"),
                     "spectral_norm": norm, "training": flag})

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        if family[0] == "first_forward":
            return {"api": family[1], "first_forward": True, "spectral_norm": family[2], "training": value}
        if family[0] == "no_grad":
            return {"api": family[1], "grad": False, "training": value}
        params = {"api": family[1], "stage": family[3], "training": value}
        if family[2]:
            params["mtype"] = family[2]
        return params

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        flag = params["training"]
        if not isinstance(flag, bool):
            raise ValueError("training")
        if "first_forward" in params:
            if params["first_forward"] is not True:
                raise ValueError("first_forward")
            if not isinstance(params.get("spectral_norm"), str):
                raise ValueError("spectral_norm")
            return ("first_forward", str(params["api"]), params["spectral_norm"]), flag
        if "grad" in params:
            if params["grad"] is not False or "stage" in params or "mtype" in params:
                raise ValueError("grad")
            return ("no_grad", str(params["api"])), flag
        return ("flag", str(params["api"]), str(params.get("mtype") or ""), str(params["stage"])), flag

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        # a call's ctx (where first_forward lives) is always kept with the call
        return FactPlan(apis={params["api"]}, args={params["api"]: {"training"}}, state_points=set(), state_attrs=set())

    def describe(self, params: Mapping[str, Any]) -> str:
        mode = "training" if params["training"] else "evaluation"
        if params.get("first_forward"):
            return (f"the first forward of a module with spectral normalisation ({params['spectral_norm']}) "
                    f"runs in {mode} mode (training={params['training']})")
        if params.get("grad") is False:
            return (f"{params['api']} runs in {mode} mode (training={params['training']}) whenever gradients "
                    f"are disabled (torch.no_grad, inference_mode)")
        what = f"{params['mtype']} modules" if params.get("mtype") else params["api"]
        return f"{what} run in {mode} mode (training={params['training']}) during stage {params['stage']!r}"

    def hint(self, params: Mapping[str, Any]) -> str:
        if params.get("first_forward"):
            return ("a spectrally-normalised layer ran its first forward in eval mode: its power-iteration "
                    "estimate of sigma was never refined, so the layer divided its weight by a sigma from random "
                    "vectors; run a training-mode forward first (or use "
                    "torch.nn.utils.parametrizations.spectral_norm)")
        if params.get("grad") is False:
            return ("dropout was active in a pass without gradients, i.e. an evaluation or generation pass: "
                    "model.eval() was not called before it, or a functional dropout call lacks "
                    "training=self.training (its default is True)")
        if params["training"]:
            return "the module is in eval mode during training: model.train() was not called back after evaluation"
        return ("the module is still in training mode during evaluation (dropout active, batch-norm statistics "
                "updated): model.eval() was not called, or a submodule overrides its mode")


#: record fields that say which mode a pass was meant to run in: a rule about passes
#: without gradients must not be scoped by them (forgetting ``eval()`` changes both)
_MODE_FIELDS = frozenset({"stage", "ctx.training"})


def _without_mode(record: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key not in _MODE_FIELDS}


def _grad_disabled(call: Mapping[str, Any]) -> bool:
    """The call ran with autograd off (``torch.no_grad``/``inference_mode``): no
    gradient can come of it, so a pass like this evaluates or generates."""
    ctx = call.get("ctx")
    return isinstance(ctx, dict) and ctx.get("grad") is False
