"""ModuleRegistration: every layer a model runs with gradients is one its optimizers train.

``{"api": "torch.nn.Module.forward"}`` — a module with parameters that runs inside
another module's forward, with gradients enabled, is registered under that model or
has parameters some optimizer holds.  Broken by layers kept in a plain Python list or
dict instead of ``nn.ModuleList``/``nn.ModuleDict`` (PyTorch issue 715), and by layers
built inside ``forward``: ``model.parameters()`` misses them, so no optimizer steps
them, and they run with their initial weights for ever while the loss still falls.

The producer marks such a forward (``ctx.unregistered``): it knows the model's
registered submodules and which parameters the program's live optimizers hold.  A
module shared between models (an embedding passed into a decoder) is held by an
optimizer and not reported; passes without gradients (a frozen teacher, a target
network) and loops without an optimizer are never judged.  The rule binds in every
stage and precision, so sites keep no context.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..events import MODULE_FORWARD
from ..window import FactPlan
from .base import Mode, Site, Template
from .view import WindowView

FAMILY = ("registered", MODULE_FORWARD)


class ModuleRegistration(Template):
    relation = "ModuleRegistration"

    def allows_precondition(self, family: tuple) -> bool:
        return False

    def sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        if not mode.wants(FAMILY):
            return
        checking = mode.checking
        for rank in view.ranks():
            for call in view.calls_by_api(rank).get(MODULE_FORWARD, ()):
                ctx = call.get("ctx")
                if call.get("parent") is None or not isinstance(ctx, dict) or ctx.get("no_params") \
                        or ctx.get("grad") is not True:
                    continue
                holds = ctx.get("unregistered") is not True
                if holds and checking:
                    continue
                yield Site(FAMILY, holds, lambda rank=rank: view.context_free_records(rank),
                           [rank], call.get("stage", ""),
                           {} if holds else {"call": call["key"], "mtype": call.get("mtype")})

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        return {"api": family[1]}

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        if params["api"] != MODULE_FORWARD:
            raise ValueError("api")
        return FAMILY, None

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        return FactPlan(apis={MODULE_FORWARD}, args={}, state_points=set(), state_attrs=set())

    def describe(self, params: Mapping[str, Any]) -> str:
        return ("every module with parameters run inside a model's forward with gradients is registered in the "
                "model or trained by an optimizer")

    def hint(self, params: Mapping[str, Any]) -> str:
        return ("a layer the model does not register (kept in a plain list or dict instead of nn.ModuleList/"
                "nn.ModuleDict, or built inside forward): model.parameters() misses it, so no optimizer trains it")
