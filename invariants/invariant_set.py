"""A deployed set of invariants, compiled for checking.

Compiling resolves each invariant's template, its (family, value) key and its
precondition predicate once, and builds the `FactPlan` — the union of what every
invariant needs — so that windows keep only those facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from .model import Invariant
from .precondition import Predicate, compile_precondition
from .relations import TEMPLATES
from .relations.base import Template
from .window import FactPlan


@dataclass
class CompiledInvariant:
    invariant: Invariant
    template: Template
    family: tuple
    value: Any
    predicate: Predicate


class InvariantSet:
    def __init__(self, invariants: Iterable[Invariant] = ()) -> None:
        self.invariants: list[Invariant] = list(invariants)
        self.compiled: list[CompiledInvariant] = []
        #: relation -> family -> compiled invariants of that family
        self.by_family: dict[str, dict[tuple, list[CompiledInvariant]]] = {}
        self.plan = FactPlan()
        for invariant in self.invariants:
            template = TEMPLATES[invariant.relation]
            family, value = template.key(invariant.params)
            compiled = CompiledInvariant(invariant, template, family, value, compile_precondition(invariant.precondition))
            self.compiled.append(compiled)
            self.by_family.setdefault(invariant.relation, {}).setdefault(family, []).append(compiled)
            self.plan.merge(template.needs(invariant.params))

    def __len__(self) -> int:
        return len(self.invariants)

    def relations(self) -> set[str]:
        return {inv.relation for inv in self.invariants}
