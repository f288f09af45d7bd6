"""The relation templates, by the name invariant files use for them."""

from __future__ import annotations

from ..model import Invariant
from .api_arg import APIArg
from .api_output import APIOutput
from .base import Site, Template
from .view import WindowView
from .consistent import Consistent
from .contain import EventContain
from .contracts import ApiContract
from .learned_writes import InitSparesLearned
from .loss_args import LossArguments
from .precision import StablePrecision
from .registration import ModuleRegistration
from .sequence import APISequence
from .stable_variables import StableVariables
from .stage_rules import AllRanksReport, APIAbsent
from .training_flag import TrainingFlag

TEMPLATES: dict[str, Template] = {
    t.relation: t
    for t in (
        Consistent(),
        EventContain(),
        APISequence(),
        APIArg(),
        APIOutput(),
        APIAbsent(),
        InitSparesLearned(),
        AllRanksReport(),
        TrainingFlag(),
        StableVariables(),
        LossArguments(),
        ModuleRegistration(),
        ApiContract(),
        StablePrecision(),
    )
}

#: The engine reports missing ranks on every window, deployed or not, under this invariant.
ALL_RANKS_REPORT = Invariant("AllRanksReport", {}, None, TEMPLATES["AllRanksReport"].describe({}), [])

__all__ = ["TEMPLATES", "ALL_RANKS_REPORT", "Site", "Template", "WindowView"]
