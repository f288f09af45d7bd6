"""Which APIs a producer must record for a deployed invariant set (selective instrumentation).

Everything an invariant reads must be recorded, including what only its precondition
or its snapshot points mention: an API left out there would leave the invariant
silently never triggered.  Snapshots (``pre:``/``post:`` an API, ``step_end``) are
taken by the producer around the optimizer calls, so they pull those APIs in.
"""

from __future__ import annotations

from .events import OPTIMIZER_STEP
from .invariant_set import InvariantSet


def needed_apis(invariant_set: InvariantSet) -> set[str]:
    apis: set[str] = set()
    for compiled in invariant_set.compiled:
        inv = compiled.invariant
        apis.update(inv.apis)
        plan = compiled.template.needs(inv.params)
        if plan.apis:
            apis.update(plan.apis)
        for point in plan.state_points or ():
            if ":" in point:
                apis.add(point.split(":", 1)[1])
            else:
                apis.add(OPTIMIZER_STEP)
    return apis
