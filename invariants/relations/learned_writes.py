"""**InitSparesLearned** — "initialiser X never writes parameters that hold learned values":
``{"api": "torch.nn.init.normal_"}`` or ``{"api": "torch.Tensor.param_overwrite"}``.

A parameter holds learned values once an optimizer (or a hand-written loop) has
trained it in this run, or once ``Module.load_state_dict`` filled it from a state dict.
The producer marks every initialiser call (``torch.nn.init.*``, and in-place
initialising writes such as ``weight.data.normal_()``, recorded as
``torch.Tensor.param_overwrite``) with ``learned``.  ``copy_`` carries no mark: it
synchronises (target networks, EMA copies, checkpoint loading) rather than initialises.

Healthy programs initialise only parameters nobody has trained or loaded yet: the model
they build, a new head over a loaded backbone, a second model built mid-run.  An
initialiser that reaches learned values erases them.  Unlike APIAbsent's "not called in
stage 'train'", the rule has no stage and no step: it also catches an evaluation job
whose whole run is the setup window (weights loaded, then the model's own
``init_weights`` run once too often), and a re-initialisation inside evaluation.

Inference: one boolean site per marked call; the rule is learnt for an API whose calls
in the references never reached learned values (with at least `min_support` of them).
A single call on learned values in a reference means that pipeline re-initialises on
purpose (k-fold cross-validation resetting its model, a plasticity reset), and no rule
is learnt for that API; no precondition can excuse it.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..window import FactPlan
from .base import Mode, Site, Template


from .view import WindowView
class InitSparesLearned(Template):
    relation = "InitSparesLearned"

    def allows_precondition(self, family: tuple) -> bool:
        return False

    def check_plan(self, families: Any) -> frozenset[str]:
        """The APIs the families are about."""
        return frozenset(f[1] for f in families)

    def sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        checking, families = mode.checking, mode.families
        for rank in view.ranks():
            if not checking:
                calls = view.calls(rank)
            else:  # the calls of the APIs the deployed rules are about
                by_api = view.calls_by_api(rank)
                calls = [call for api in mode.plan if api in by_api for call in by_api[api]]
            for call in calls:
                learned = call.get("learned")
                if learned.__class__ is not bool or (checking and not learned):
                    continue  # not an initialiser; or, when checking, a site that holds
                family = ("spares_learned", call["api"])
                if checking and family not in families:
                    continue
                # no context in the records: the rule binds in every stage, grad mode and
                # precision (an init_weights() under torch.no_grad() erases weights too)
                yield Site(family, not learned, [{"rank": rank}], [rank], call.get("stage", ""),
                           lambda call=call: {"call": call["key"], "target": _target(call), "step": view.step,
                                              "trained": call.get("trained")})

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        return {"api": family[1]}

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        return ("spares_learned", str(params["api"])), None

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        return FactPlan(apis={params["api"]}, args={params["api"]: None}, state_points=set(), state_attrs=set())

    def describe(self, params: Mapping[str, Any]) -> str:
        return (f"{params['api']} never writes parameters that hold learned values "
                "(trained in this run or loaded by load_state_dict)")

    def hint(self, params: Mapping[str, Any]) -> str:
        return ("an initialiser overwrote weights that were trained or loaded from a checkpoint: "
                "an init_weights()/reset_parameters() call runs after load_state_dict or after training "
                "started (move it before the load, or initialise only the new modules)")


def _target(call: Mapping[str, Any]) -> Any:
    """The written tensor's summary (its parameter name once the model has been named)."""
    args = call.get("args")
    return args.get("tensor") if isinstance(args, dict) else None
