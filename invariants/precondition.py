"""Preconditions: when an invariant applies, learned from positive and negative examples.

A precondition is a disjunction of conjunctions of clauses, optionally negated as a
whole; each clause may itself be negated.  Clauses speak about the *records* of an
example (one record for "this call", several for "this parameter on every rank"):

``constant``    every record has ``field`` equal to one of ``values``
``consistent``  every record has the same value of ``field``
``unequal``     the records' values of ``field`` are pairwise distinct
``exists``      every record has a (non-None) value of ``field``

Example, learned for "``Optimizer.step`` changes a parameter's data"::

    {"negated": false, "any": [{"all": [{"kind": "constant", "field": "has_grad", "values": [true]}]}]}

How preconditions are learned is `invariants.precondition_inference`; this module
compiles, describes and validates them, with the same clause semantics inference uses.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

Record = Mapping[str, Any]
Clause = tuple  # ("constant", field, value, type name) | ("consistent"|"unequal"|"exists", field)
Signature = frozenset

CLAUSE_KINDS = ("constant", "consistent", "unequal", "exists")

_MISSING = object()
#: Readability order when several clauses separate equally well: stage and flags first.
_FIELD_PRIORITY = ("stage", "has_grad", "requires_grad", "training", "ctx.autocast", "ctx.grad", "step_is_first")

Predicate = Callable[[Sequence[Record]], bool]
ClauseCheck = Callable[[Sequence[Record]], bool]


def hashable_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and not (isinstance(value, float) and value != value)


def _clause_rank(clause: Clause) -> tuple:
    name = clause[1]
    priority = _FIELD_PRIORITY.index(name) if name in _FIELD_PRIORITY else len(_FIELD_PRIORITY)
    kind_order = CLAUSE_KINDS.index(clause[0])
    return (priority, kind_order, name, repr(clause[2:]))


def sorted_clauses(clauses: Iterable[Clause]) -> list[Clause]:
    return sorted(clauses, key=_clause_rank)


def _always(records: Sequence[Record]) -> bool:
    return True


def needs_records(predicate: Predicate) -> bool:
    """False for the precondition-free predicate: callers may skip building records."""
    return predicate is not _always


def _exists_check(name: str) -> ClauseCheck:
    def check(records: Sequence[Record]) -> bool:
        for record in records:
            if record.get(name) is None:  # missing or None
                return False
        return True

    return check


def _constant_check(name: str, values: tuple) -> ClauseCheck:
    # the type is part of the clause: True == 1 in Python, but not in a rule
    if len(values) == 1:
        want = values[0]
        want_type = type(want)

        def check_one(records: Sequence[Record]) -> bool:
            for record in records:
                value = record.get(name, _MISSING)
                if type(value) is not want_type or not value == want:
                    return False
            return True

        return check_one

    def check_any(records: Sequence[Record]) -> bool:
        for record in records:
            value = record.get(name, _MISSING)
            if not any(type(value) is type(want) and value == want for want in values):
                return False
        return True

    return check_any


def _consistent_check(name: str) -> ClauseCheck:
    def check(records: Sequence[Record]) -> bool:
        got = [record.get(name) for record in records]
        if any(v is None for v in got):  # missing or None
            return False
        return all(v == got[0] for v in got)

    return check


def _unequal_check(name: str) -> ClauseCheck:
    def check(records: Sequence[Record]) -> bool:
        got = [record.get(name) for record in records]
        if any(v is None for v in got):  # missing or None
            return False
        try:
            return len(set(got)) == len(got)
        except TypeError:
            return False

    return check


def _never(records: Sequence[Record]) -> bool:
    return False


def _clause_check(kind: str, name: str, values: tuple) -> ClauseCheck:
    if kind == "exists":
        return _exists_check(name)
    if kind == "constant":
        return _constant_check(name, values)
    if kind == "consistent":
        return _consistent_check(name)
    if kind == "unequal":
        return _unequal_check(name)
    return _never


def compile_precondition(pre: Mapping[str, Any] | None) -> Predicate:
    """Turn the JSON form into a closure; no eval, no attribute lookups by name."""
    if pre is None:
        return _always
    conjunctions: list[tuple[tuple[ClauseCheck, bool], ...]] = []
    for conj in pre["any"]:
        conjunctions.append(tuple(
            (_clause_check(c["kind"], c["field"], tuple(c.get("values") or ())), bool(c.get("negated", False)))
            for c in conj["all"]
        ))
    negated = bool(pre.get("negated", False))

    def predicate(records: Sequence[Record]) -> bool:
        for conj in conjunctions:
            for check, negated_clause in conj:
                if check(records) == negated_clause:
                    break
            else:
                return not negated  # this conjunction holds
        return negated

    return predicate


# --------------------------------------------------------------------------- JSON form


def clause_to_json(clause: Clause) -> dict[str, Any]:
    if clause[0] == "constant":
        return {"kind": "constant", "field": clause[1], "values": [clause[2]]}
    return {"kind": clause[0], "field": clause[1]}


def dnf_to_json(disjuncts: Sequence[Sequence[Clause]], negated: bool = False) -> dict[str, Any]:
    return {
        "negated": negated,
        "any": [{"all": [clause_to_json(c) for c in sorted_clauses(conj)]} for conj in disjuncts],
    }


def describe_precondition(pre: Mapping[str, Any] | None) -> str:
    """Plain words for reports: ``stage = train and has_grad = True``."""
    if pre is None:
        return "always"
    parts = []
    for conj in pre["any"]:
        words = []
        for c in conj["all"]:
            kind, name = c["kind"], c["field"]
            if kind == "constant":
                vals = c.get("values") or []
                text = f"{name} = {vals[0]!r}" if len(vals) == 1 else f"{name} in {vals!r}"
            elif kind == "consistent":
                text = f"{name} is the same on all"
            elif kind == "unequal":
                text = f"{name} differs between all"
            else:
                text = f"{name} is known"
            words.append(("not " if c.get("negated") else "") + text)
        parts.append(" and ".join(words) if words else "always")
    text = " or ".join(f"({p})" if len(pre["any"]) > 1 else p for p in parts)
    return f"not ({text})" if pre.get("negated") else text


def validate_precondition(pre: Any, where: str) -> None:
    """Raise ValueError naming the exact path of the first malformed part."""
    if pre is None:
        return
    if not isinstance(pre, dict):
        raise ValueError(f"{where}: must be an object or null")
    if not isinstance(pre.get("negated", False), bool):
        raise ValueError(f"{where}.negated: must be a boolean")
    conjunctions = pre.get("any")
    if not isinstance(conjunctions, list) or not conjunctions:
        raise ValueError(f"{where}.any: must be a non-empty list of conjunctions")
    for i, conj in enumerate(conjunctions):
        if not isinstance(conj, dict) or not isinstance(conj.get("all"), list):
            raise ValueError(f"{where}.any[{i}]: must be an object with an 'all' list")
        for j, clause in enumerate(conj["all"]):
            path = f"{where}.any[{i}].all[{j}]"
            if not isinstance(clause, dict):
                raise ValueError(f"{path}: must be an object")
            if clause.get("kind") not in CLAUSE_KINDS:
                raise ValueError(f"{path}.kind: must be one of {', '.join(CLAUSE_KINDS)}")
            if not isinstance(clause.get("field"), str) or not clause["field"]:
                raise ValueError(f"{path}.field: must be a non-empty string")
            if clause["kind"] == "constant":
                values = clause.get("values")
                if not isinstance(values, list) or not values or not all(v is None or hashable_scalar(v) for v in values):
                    raise ValueError(f"{path}.values: must be a non-empty list of scalars or null")
            if not isinstance(clause.get("negated", False), bool):
                raise ValueError(f"{path}.negated: must be a boolean")
