"""Learning a precondition from positive and negative examples.

Inference works on *signatures*: the set of atomic clauses an example satisfies.
Examples with the same signature are counted, not stored, so evidence from millions
of events stays a handful of dict entries, and merging traces is a Counter update.
The learned formula is checked through `precondition.compile_precondition`, which
evaluates the same clause semantics on live records.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Sequence

from .precondition import (
    Clause,
    Record,
    Signature,
    clause_to_json,
    dnf_to_json,
    hashable_scalar,
    sorted_clauses,
)

#: Fields whose concrete value must never become a rule (a rule about "rank 3" is noise);
#: they may still appear in consistent/unequal/exists clauses.
NO_CONSTANT_FIELDS = frozenset({"rank"})
MAX_DISJUNCTS = 4
#: The execution context a rule was learned in.  Every learned conjunction keeps the
#: context clauses its positives share, even when they are not needed to reject a
#: negative: a rule seen only without autocast, or only in training, must not be
#: applied blindly under autocast or in evaluation.
CONTEXT_FIELDS = frozenset({"stage", "ctx.autocast", "ctx.grad", "ctx.training"})


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
        if any(v is None or not hashable_scalar(v) for v in values):
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


def _excludes_all(conj: frozenset, negatives: Iterable[Signature]) -> bool:
    return all(not conj <= neg for neg in negatives)


def _minimise(conj: frozenset, negatives: Sequence[Signature]) -> frozenset | None:
    """Greedy set cover: the fewest clauses of ``conj`` that still reject every negative."""
    remaining = [neg for neg in negatives if conj <= neg]
    if remaining:
        return None
    remaining = list(negatives)
    chosen: list[Clause] = []
    candidates = sorted_clauses(conj)
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
    clauses = [dict(clause_to_json(c), negated=True) for c in sorted_clauses(negated)]
    clauses += [clause_to_json(c) for c in sorted_clauses(context)]
    return True, {"negated": False, "any": [{"all": clauses}]}
