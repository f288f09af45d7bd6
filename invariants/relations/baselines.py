"""What a run's first windows say about its variables, kept for the rest of the run.

Some facts a cross-rank or tie rule needs cannot be seen in the window it judges:
which variables are rank-local by design (expert-parallel experts, tensor-parallel
shards: they differ across ranks from the start while the replicas agree), and which
names were tied to each other before a restore could have untied them.  The engine
computes these baselines from the setup window and the first iteration and keeps
them in the run state; inference computes them the same way.
"""

from __future__ import annotations

from typing import Any

from ..rank_facts import RankFacts
from .view import WindowView, freeze

RANK_ATTRS = ("data_digest", "grad_digest", "shape", "dtype")
#: the first iteration's snapshot of a variable before any update reached it
BEFORE_FIRST_UPDATE = "pre:torch.optim.Optimizer.step"


def latest_by_name(facts: RankFacts, at: str) -> dict[str, dict[str, Any]]:
    """name -> attrs of the last snapshot at ``at`` (later calls win; call keys sort by pid:cid).

    Read-only: with a single snapshotting call (the common case) this is the window's
    own mapping, not a copy.
    """
    per_call = facts.states.get(at) or {}
    if len(per_call) == 1:
        return next(iter(per_call.values()))
    merged: dict[str, dict[str, Any]] = {}
    for call_key in sorted(per_call, key=_call_order):
        merged.update(per_call[call_key])
    return merged


def _call_order(call_key: str) -> tuple[int, int]:
    if call_key == "-":
        return (-1, -1)
    pid, _, cid = call_key.partition(":")
    try:
        return (int(pid), int(cid))
    except ValueError:
        return (0, 0)


#: step 0 is the setup window (no update yet), step 1 the first training iteration
FIRST_ITERATION_STEP = 1


def merge_baselines(earlier: dict[str, list[str]] | None, later: dict[str, list[str]]) -> dict[str, list[str]]:
    """Rank-local variables of the setup window and of the first iteration together: a
    shard built from one seed on every rank parts only at its first update."""
    merged = {attr: set(names) for attr, names in (earlier or {}).items()}
    for attr, names in later.items():
        merged.setdefault(attr, set()).update(names)
    return {attr: sorted(names) for attr, names in merged.items()}


def replication_baseline(window: Any, *, before_update: bool = False) -> dict[str, list[str]]:
    """Variables that differ across ranks somewhere in step 0, when others never do.

    Expert-parallel experts and tensor-parallel shards carry the same names on every
    rank but are not replicas; a cross-rank rule learned from data-parallel runs must
    not judge them.  They reveal themselves at the first step: some variables agree
    across ranks (the replicated ones) and these do not.  When *nothing* agrees at
    step 0 the replicas were never synchronised — a bug the rule must still report —
    so no variable is exempted.  Returns attr -> sorted names.

    ``before_update`` is for the first iteration (step 1), whose setup window may not
    have snapshotted the variables at all: there only the snapshots taken before the
    first update count.  A variable that differs across ranks *before* it was ever
    updated was built that way (an expert initialised from its rank's seed); one that
    parts at the update is what a skipped all-reduce looks like, and stays judged.
    """
    view = WindowView(window)
    ranks = view.ranks()
    result: dict[str, list[str]] = {}
    if len(ranks) < 2:
        return result
    points: set[str] = set()
    for rank in ranks:
        points.update(view.facts(rank).states)
    if before_update:
        points &= {BEFORE_FIRST_UPDATE}
    # (name, its snapshots on the ranks holding it) per point, shared by every attribute
    columns: list[tuple[str, list[dict[str, Any]]]] = []
    for at in points:
        snapshots = [latest_by_name(view.facts(rank), at) for rank in ranks]
        for name in set().union(*(s.keys() for s in snapshots)):
            holders = [s[name] for s in snapshots if name in s]
            if len(holders) >= 2:
                columns.append((name, holders))
    for attr in RANK_ATTRS:
        differing: set[str] = set()
        agreeing: set[str] = set()
        for name, holders in columns:
            agree = _replicas_agree([attrs.get(attr) for attrs in holders])
            if agree is not None:
                (agreeing if agree else differing).add(name)
        # a shard may start equal (same init seed) and part after its first update:
        # differing anywhere in step 0 makes a variable rank-local, provided some
        # other variable agreed everywhere (the replicas exist)
        local = differing if agreeing - differing else set()
        if local:
            result[attr] = sorted(local)
    return result


def _replicas_agree(values: list[Any]) -> bool | None:
    """Whether the ranks' values of one attribute are the same (None: none has one).

    Digests and dtypes are strings, compared as they are; anything else is frozen
    first, so that a shape list and its tuple form agree."""
    first = values[0]
    if first.__class__ is str and all(v.__class__ is str and v == first for v in values):
        return True
    frozen = [freeze(v) for v in values]
    if all(v is None for v in frozen):
        return None
    return len(set(frozen)) == 1


def tie_baseline(window: Any) -> list[list[str]]:
    """``[alias, primary]`` pairs of every tie snapshotted in a run's step-0 window."""
    pairs: set[tuple[str, str]] = set()
    for facts in window.ranks.values():
        for per_call in facts.states.values():
            for snapshot in per_call.values():
                for name, attrs in snapshot.items():
                    primary = attrs.get("alias_of")
                    if isinstance(primary, str) and primary and primary != name:
                        pairs.add((name, primary))
    return [list(pair) for pair in sorted(pairs)]
