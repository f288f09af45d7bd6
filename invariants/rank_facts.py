"""What a window keeps of one rank's events: `RankFacts`, folded by `window.WindowState`.

A struct rather than a string-keyed dict so that readers name what they read, and
folding (the checker's hot path) pays attribute access instead of hashing keys.  Its
stored form is unchanged: a msgpack map holding the five facts every rank has and the
optional ones only when they differ from their "nothing reported" default, so window
bytes written before the struct existed (the evaluation fixtures, a checker's
changelog) still restore.

Call facts stay dicts: their keys are the optional fields of one call
(`WindowState._call_fact`) and templates read them with ``get``.
"""

from __future__ import annotations

from typing import Any

import msgspec


class RankFacts(msgspec.Struct):
    """One rank's part of a (run, step) window."""

    #: the rank reported this step's end
    ended: bool = False
    #: its stage at the step end; until then, that of its latest event
    stage: str = ""
    #: one small dict per recorded call of a planned API: api, key, parent, stage,
    #: module/mtype/training (``Module.forward``), the receiver's id (``obj``), the
    #: optimizers a ``Module.zero_grad`` clears (``clears``), whether an initialiser's
    #: target was trained (``trained``) or held learned values (``learned``), whether
    #: an optimizer's gradients were cleared since its previous step (``cleared``),
    #: filtered args, return summary, ctx, whether it raised, and its order ``o`` in
    #: the rank's stream
    calls: list[dict[str, Any]] = msgspec.field(default_factory=list)
    #: ``"pid:cid" -> parent key`` for every call, only when a plan needs to know which
    #: calls happen inside which (EventContain with a call child)
    links: dict[str, str | None] = msgspec.field(default_factory=dict)
    #: ``at -> call key -> name -> attrs`` snapshots at planned points
    states: dict[str, dict[str, dict[str, dict[str, Any]]]] = msgspec.field(default_factory=dict)
    #: pids of the DataLoader workers that reported, and how many the rank announced:
    #: a window is complete only once they all did, since their batches travel on their
    #: own connections and arrive after the rank's step end
    worker_pids: list[int] = msgspec.field(default_factory=list)
    workers_expected: int = 0
    #: optimizer steps begun (coverage of producers that do not mark ``trained``)
    optimizer_steps: int = 0
    #: what the step end says of the run model (`coverage.note_step_end`)
    setup: bool = False
    trained: bool | None = None
    #: the producer sampled parameter snapshots out of this window
    unsampled: bool = False
    #: the producer's own account (`coverage.note_meta`): run_end's
    #: [iterations, optimizer steps], batches it dropped, its snapshot sampling
    run_end: list[int | None] | None = None
    #: run_end's count of trainer calls made without a backward and not recorded
    left_out_calls: int = 0
    #: run_end's word that the rank trained a separate model (`producers.replicas`)
    separate_model: bool = False
    dropped_batches: int = 0
    sample_every: int = 1
    #: [budget, measured share] of a producer working under an overhead budget
    overhead: list[float] | None = None

    def to_map(self) -> dict[str, Any]:
        """The stored form (see the module docstring)."""
        stored: dict[str, Any] = {"ended": self.ended, "stage": self.stage, "calls": self.calls,
                                  "links": self.links, "states": self.states}
        for name, default in _OPTIONAL:
            value = getattr(self, name)
            if value != default:
                stored[name] = value
        return stored

    @classmethod
    def from_map(cls, stored: dict[str, Any]) -> "RankFacts":
        """Inverse of `to_map`; keys it does not know are dropped."""
        return cls(**{name: value for name, value in stored.items() if name in _FIELDS})


_FIELDS = frozenset(RankFacts.__struct_fields__)
#: (field, default) of the facts stored only when reported
_OPTIONAL = (("worker_pids", []), ("workers_expected", 0), ("optimizer_steps", 0), ("setup", False),
             ("trained", None), ("unsampled", False), ("run_end", None), ("left_out_calls", 0),
             ("separate_model", False), ("dropped_batches", 0), ("sample_every", 1), ("overhead", None))
