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

Inference works on *signatures*: the set of atomic clauses an example satisfies.
Examples with the same signature are counted, not stored, so evidence from millions
of events stays a handful of dict entries, and merging traces is a Counter update.
The learned formula is checked through `compile_precondition`, which evaluates the
same clause semantics on live records.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Iterable, Mapping, Sequence

Record = Mapping[str, Any]
Clause = tuple  # ("constant", field, value, type name) | ("consistent"|"unequal"|"exists", field)
Signature = frozenset

CLAUSE_KINDS = ("constant", "consistent", "unequal", "exists")
#: Fields whose concrete value must never become a rule (a rule about "rank 3" is noise);
#: they may still appear in consistent/unequal/exists clauses.
NO_CONSTANT_FIELDS = frozenset({"rank"})
#: Readability order when several clauses separate equally well: stage and flags first.
_FIELD_PRIORITY = ("stage", "has_grad", "requires_grad", "training", "ctx.autocast", "ctx.grad", "step_is_first")
MAX_DISJUNCTS = 4
#: The execution context a rule was learned in.  Every learned conjunction keeps the
#: context clauses its positives share, even when they are not needed to reject a
#: negative: a rule seen only without autocast, or only in training, must not be
#: applied blindly under autocast or in evaluation.
CONTEXT_FIELDS = frozenset({"stage", "ctx.autocast", "ctx.grad", "ctx.training"})

_MISSING = object()


def _hashable(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and not (isinstance(value, float) and value != value)


class SignatureCache:
    """Memoises `signature` by record content: sites repeat a handful of record shapes
    millions of times (same stage, module type, flags), so inference computes each
    signature once.  Bounded: cleared when it grows past ``limit`` entries."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._cache: dict[tuple, Signature] = {}

    def __call__(self, records: Sequence[Record]) -> Signature:
        try:
            # records built by one builder share key order, so unsorted items are a valid key
            key = tuple(tuple(record.items()) for record in records)
            cached = self._cache.get(key)
        except TypeError:  # an unhashable value: compute directly
            return signature(records)
        if cached is None:
            if len(self._cache) >= self.limit:
                self._cache.clear()
            cached = self._cache[key] = signature(records)
        return cached


def signature(records: Sequence[Record]) -> Signature:
    """Every atomic clause the example's records satisfy."""
    clauses: set[Clause] = set()
    if not records:
        return frozenset()
    fields = set(records[0])
    for record in records[1:]:
        fields &= set(record)
    multi = len(records) > 1
    for name in fields:
        values = [record[name] for record in records]
        if name in CONTEXT_FIELDS and all(v is None for v in values):
            # "no autocast" is context too: a rule learned without autocast must say so
            clauses.add(("constant", name, None, "NoneType"))
            continue
        if any(v is None or not _hashable(v) for v in values):
            continue
        clauses.add(("exists", name))
        first = values[0]
        if all(v == first and type(v) is type(first) for v in values):
            if name not in NO_CONSTANT_FIELDS:
                # the type is part of the clause: True == 1 in Python, but not in a rule
                clauses.add(("constant", name, first, type(first).__name__))
            if multi:
                clauses.add(("consistent", name))
        elif multi and len(set(values)) == len(values):
            clauses.add(("unequal", name))
    return frozenset(clauses)


# --------------------------------------------------------------------------- checking
#
# Checking runs a predicate at every site where a rule failed, so clauses are compiled
# into small closures specialised by kind (and, for ``constant``, by the number of
# allowed values) instead of being interpreted per record.


Predicate = Callable[[Sequence[Record]], bool]
ClauseCheck = Callable[[Sequence[Record]], bool]


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
        "any": [{"all": [clause_to_json(c) for c in _sorted_clauses(conj)]} for conj in disjuncts],
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


# --------------------------------------------------------------------------- inference


def _clause_rank(clause: Clause) -> tuple:
    name = clause[1]
    priority = _FIELD_PRIORITY.index(name) if name in _FIELD_PRIORITY else len(_FIELD_PRIORITY)
    kind_order = CLAUSE_KINDS.index(clause[0])
    return (priority, kind_order, name, repr(clause[2:]))


def _sorted_clauses(clauses: Iterable[Clause]) -> list[Clause]:
    return sorted(clauses, key=_clause_rank)


def _excludes_all(conj: frozenset, negatives: Iterable[Signature]) -> bool:
    return all(not conj <= neg for neg in negatives)


def _minimise(conj: frozenset, negatives: Sequence[Signature]) -> frozenset | None:
    """Greedy set cover: the fewest clauses of ``conj`` that still reject every negative."""
    remaining = [neg for neg in negatives if conj <= neg]
    if remaining:
        return None
    remaining = list(negatives)
    chosen: list[Clause] = []
    candidates = _sorted_clauses(conj)
    while remaining:
        best = max(candidates, key=lambda c: (sum(1 for neg in remaining if c not in neg), -candidates.index(c)))
        rejected = [neg for neg in remaining if best not in neg]
        if not rejected:
            return None
        chosen.append(best)
        remaining = [neg for neg in remaining if best in neg]
    return frozenset(chosen)


def _cover(positives: Counter, negatives: Counter) -> list[frozenset] | None:
    """A DNF true on every positive signature and false on every negative one."""
    neg_sigs = sorted(negatives, key=lambda s: sorted(map(repr, s)))
    remaining = sorted(positives, key=lambda s: (-positives[s], sorted(map(repr, s))))
    if not remaining:
        return None
    common = frozenset.intersection(*remaining)
    if _excludes_all(common, neg_sigs):
        minimal = _minimise(common, neg_sigs)
        return [minimal] if minimal is not None else None
    disjuncts: list[frozenset] = []
    while remaining:
        seed = remaining[0]
        if not _excludes_all(seed, neg_sigs):
            return None
        conj = seed
        covered = [seed]
        for other in remaining[1:]:
            merged = conj & other
            if merged and _excludes_all(merged, neg_sigs):
                conj = merged
                covered.append(other)
        minimal = _minimise(conj, neg_sigs)
        if minimal is None:
            return None
        disjuncts.append(minimal)
        remaining = [sig for sig in remaining if not minimal <= sig]
        if len(disjuncts) > MAX_DISJUNCTS:
            return None
    return disjuncts


def _context(signatures: Iterable[Signature]) -> frozenset:
    """Context clauses shared by all the given signatures."""
    sigs = list(signatures)
    if not sigs:
        return frozenset()
    common = frozenset.intersection(*sigs)
    return frozenset(c for c in common if c[1] in CONTEXT_FIELDS and c[0] == "constant")


def _closed_world(clause: Clause) -> bool:
    """Whether NOT(clause) is safe on values never seen: only for booleans and None."""
    if clause[0] != "constant":
        return True
    return isinstance(clause[2], bool) or clause[2] is None


def infer_precondition(positives: Counter, negatives: Counter) -> tuple[bool, dict[str, Any] | None]:
    """Returns ``(ok, precondition)``; ``ok`` is False when no safe formula separates the examples.

    A formula is learned that accepts every positive and rejects every negative
    (greedy set cover, at most `MAX_DISJUNCTS` conjunctions), and each conjunction
    keeps the context its positives share.  When only the negatives can be described
    ("holds except at the first step"), their formula is negated into one conjunction
    of negated clauses — allowed only when every negated clause is about a boolean or
    None, because ``not mtype = Embedding`` would also accept module types never seen.
    No negatives and no shared context means no precondition.
    """
    if not positives:
        return False, None
    if not negatives:
        context = _context(positives)
        return True, (dnf_to_json([context]) if context else None)
    direct = _cover(positives, negatives)
    if direct is not None:
        extended = [conj | _context(sig for sig in positives if conj <= sig) for conj in direct]
        return True, dnf_to_json(extended)
    inverse = _cover(negatives, positives)
    if inverse is None or any(len(conj) != 1 for conj in inverse):
        return False, None
    negated = [next(iter(conj)) for conj in inverse]
    if not all(_closed_world(c) for c in negated):
        return False, None
    context = _context(positives)
    clauses = [dict(clause_to_json(c), negated=True) for c in _sorted_clauses(negated)]
    clauses += [clause_to_json(c) for c in _sorted_clauses(context)]
    return True, {"negated": False, "any": [{"all": clauses}]}


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
                if not isinstance(values, list) or not values or not all(v is None or _hashable(v) for v in values):
                    raise ValueError(f"{path}.values: must be a non-empty list of scalars or null")
            if not isinstance(clause.get("negated", False), bool):
                raise ValueError(f"{path}.negated: must be a boolean")
