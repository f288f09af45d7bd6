"""TrainingFlag: "calls of API X (on modules of type M) run with ``training = F`` in
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

from typing import Any, Iterator, Mapping

from ..events import MODULE_FORWARD
from ..window import FactPlan
from .base import Mode, Site, Template
from .stage_rules import calls_of
from .view import WindowView

#: Spectral-norm implementations whose estimate is only refined by training-mode forwards.
LAZY_SPECTRAL_NORMS = frozenset({"hook"})


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

    def sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        checking, families = mode.checking, mode.families
        first_wanted, apis = mode.plan if checking else (True, None)
        for rank in view.ranks():
            for call in calls_of(view, rank, apis):
                api = call["api"]
                if first_wanted and api == MODULE_FORWARD:
                    ctx = call.get("ctx")  # most forwards are not a module's first: skip them here
                    if isinstance(ctx, dict) and ctx.get("first_forward") is True:
                        site = self._first_forward_site(view, call, rank, mode)
                        if site is not None:
                            yield site
                flag = call.get("training")
                if not isinstance(flag, bool):
                    args = call.get("args") or {}
                    flag = args.get("training")
                    if not isinstance(flag, bool):
                        continue
                if ("dropout" in api and _drops_nothing(call)) or (flag and _monte_carlo_dropout(view, rank, call)):
                    continue
                stage = call.get("stage", "")
                families_here = [("flag", api, call.get("mtype") or "", stage)]
                if "dropout" in api and _grad_disabled(call) and not _in_untrained_model(call):
                    families_here.append(("no_grad", api))
                for family in families_here:
                    if checking and family not in families:
                        continue
                    records = (lambda call=call, rank=rank: [view.call_record(call, rank)]) if family[0] == "flag" else (
                        lambda call=call, rank=rank: [_without_mode(view.call_record(call, rank))])
                    yield Site(family, frozenset([flag]), records, [rank], stage,
                               lambda call=call, flag=flag: {"call": call["key"], "module": call.get("module"),
                                                             "mtype": call.get("mtype"), "training": flag})

    @staticmethod
    def _first_forward_site(view: WindowView, call: dict[str, Any], rank: int, mode: Mode) -> Site | None:
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
        if not mode.wants(family):
            return None
        records = view.context_free_records(rank)
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
        kept = {"training", "p"} if "dropout" in params["api"] else {"training"}
        return FactPlan(apis={params["api"]}, args={params["api"]: kept}, state_points=set(), state_attrs=set())

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


def _drops_nothing(call: Mapping[str, Any]) -> bool:
    """A dropout with ``p = 0`` changes no value in either mode: models configured with
    zero dropout (most large language models) run it in training mode during
    generation rollouts and momentum-encoder passes without gradients, harmlessly."""
    rate = (call.get("args") or {}).get("p")
    return type(rate) in (int, float) and rate == 0


#: module types whose forward is a dropout (kept in training mode on purpose for Monte
#: Carlo dropout: ``model.eval()`` then ``.train()`` on these modules alone)
DROPOUT_MODULES = frozenset({"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
                             "FeatureAlphaDropout"})


def _monte_carlo_dropout(view: WindowView, rank: int, call: Mapping[str, Any]) -> bool:
    """Dropout switched on by hand inside a model in eval mode: a dropout module in
    training mode (or the dropout call it makes) while its model is in eval mode.
    Forgetting ``eval()`` leaves the model in training mode too; a functional dropout
    that ignores ``self.training`` is called by a module that is itself in eval mode."""
    ctx = call.get("ctx")
    if not isinstance(ctx, dict) or ctx.get("training") is not False:
        return False
    if call.get("mtype") in DROPOUT_MODULES:
        return _switched_on(call)
    parent = call.get("parent")
    if parent is None or "dropout" not in call.get("api", ""):
        return False
    caller = next((c for c in view.calls_by_api(rank).get(MODULE_FORWARD, ()) if c.get("key") == parent), None)
    return caller is not None and caller.get("mtype") in DROPOUT_MODULES and _switched_on(caller)


def _in_untrained_model(call: Mapping[str, Any]) -> bool:
    """A pass without gradients through a model no optimizer trains (Mean Teacher's EMA
    teacher, a target network) may keep dropout on by design; forgetting ``eval()``
    before evaluating is about the model being trained."""
    ctx = call.get("ctx")
    return isinstance(ctx, dict) and ctx.get("untrained_model") is True


def _switched_on(module_call: Mapping[str, Any]) -> bool:
    """A dropout module of the model (``module`` is its path there) in training mode:
    ``model.eval()`` reached it, so only a later ``.train()`` on it can have switched it
    on.  A module the model does not register (kept in a Python list) never gets
    ``eval()`` at all: that is a bug and stays judged."""
    return module_call.get("training") is True and isinstance(module_call.get("module"), str)


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
