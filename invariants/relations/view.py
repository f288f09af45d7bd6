"""The window as relation templates read it: calls, snapshots and the records of both.

Templates never read `WindowState`'s storage directly: `WindowView` gives them calls in
order, the snapshots of a call point, and *records* (the flat field maps preconditions
are tested on), so inference and checking read the same fields the same way and the
storage can change without touching a rule.  `freeze`/`thaw` make observed values
hashable hypothesis values and back.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..rank_facts import RankFacts
from ..window import WindowState, sorted_calls

Record = dict[str, Any]
#: ctx entries of a module's first forward only (producers/module_facts.py).  They are
#: facts about the module, not the execution context; only the first-forward rule
#: (`stage_rules.TrainingFlag`) reads them, and as precondition fields they would only
#: split every other rule's step-0 examples into new shapes.
FIRST_FORWARD_FACTS = frozenset({"first_forward", "spectral_norm", "spectral_norm_refined"})
#: How many enclosing calls are followed up the links map: a malformed, cyclic map
#: must not loop forever.
MAX_CALL_DEPTH = 64
#: grad_norm / data_norm above which an optimizer step is expected to move float32 weights
SIGNIFICANT_GRAD_RATIO = 1e-4


_PLAIN = frozenset({str, int, float, bool, type(None)})


def freeze(value: Any) -> Any:
    """A hashable, msgpack/JSON-stable stand-in for an argument or return summary."""
    if value.__class__ in _PLAIN:  # most values: digests, flags, sizes
        return value
    if isinstance(value, dict):
        return tuple(sorted((str(k), freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(map(freeze, value))
    return value


def thaw(value: Any) -> Any:
    """JSON-friendly form of a frozen value (tuples become lists)."""
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


_HEX = frozenset("0123456789abcdef:x")


def _low_cardinality(text: str) -> bool:
    return len(text) <= 24 and "/" not in text and not (len(text) >= 8 and set(text.lower()) <= _HEX)


def is_scalar(value: Any) -> bool:
    return isinstance(value, (str, bool, int, float)) and not (isinstance(value, float) and value != value)


class WindowView:
    """Read-only queries over a `WindowState`, computed once per evaluation."""

    def __init__(self, window: WindowState, rank_local: Mapping[str, Any] | None = None,
                 variable_counts: Mapping[str, Any] | None = None, ties: list | None = None,
                 precisions: Mapping[str, list[str]] | None = None) -> None:
        self.window = window
        self.run = window.run
        self.step = window.step
        #: attr -> names of variables that are not replicas across ranks in this run
        #: (see `consistent.replication_baseline`)
        self.rank_local: Mapping[str, Any] = rank_local or {}
        #: at -> rank -> number of variables snapshotted at step 0 (StableVariables)
        self.variable_counts: Mapping[str, Any] = variable_counts or {}
        #: [alias, primary] pairs tied at step 0 (see `consistent.tie_baseline`)
        self.ties: list = ties or []
        #: model|module path -> dtypes of its previous training iteration (`precision`)
        self.precisions: Mapping[str, list[str]] = precisions or {}
        #: what a template derives from this window and the run's baselines then reuse
        #: after the checks (module precisions per rank): computed once per evaluation
        self.derived: dict[str, Any] = {}
        self._ranks: list[int] | None = None
        self._calls: dict[int, list[dict[str, Any]]] = {}
        self._calls_by_api: dict[int, dict[str, list[dict[str, Any]]]] = {}
        self._children: dict[int, dict[str, list[dict[str, Any]]]] = {}

    def ranks(self) -> list[int]:
        """The window's ranks in order (shared by every template: do not modify)."""
        if self._ranks is None:
            self._ranks = sorted(self.window.ranks)
        return self._ranks

    def facts(self, rank: int) -> RankFacts:
        return self.window.ranks[rank]

    def calls(self, rank: int) -> list[dict[str, Any]]:
        cached = self._calls.get(rank)
        if cached is None:
            cached = sorted_calls(self.window.ranks[rank])
            self._calls[rank] = cached
        return cached

    def calls_by_api(self, rank: int) -> dict[str, list[dict[str, Any]]]:
        """API -> the rank's calls of it in emission order.

        Checking walks only the APIs deployed rules name; since every family is about
        one API, each family still sees its sites in emission order.
        """
        cached = self._calls_by_api.get(rank)
        if cached is None:
            cached = {}
            for call in self.calls(rank):
                group = cached.get(call["api"])
                if group is None:
                    cached[call["api"]] = [call]
                else:
                    group.append(call)
            self._calls_by_api[rank] = cached
        return cached

    def children(self, rank: int) -> dict[str, list[dict[str, Any]]]:
        """Call key -> recorded calls made (directly or not) inside it."""
        cached = self._children.get(rank)
        if cached is None:
            links = self.window.ranks[rank].links
            cached = {}
            for call in self.calls(rank):
                if not links:
                    if call.get("parent"):
                        cached.setdefault(call["parent"], []).append(call)
                    continue
                # the enclosing calls, innermost first
                parent, depth = links.get(call["key"]), 0
                while parent is not None and depth < MAX_CALL_DEPTH:
                    group = cached.get(parent)
                    if group is None:
                        cached[parent] = [call]
                    else:
                        group.append(call)
                    parent, depth = links.get(parent), depth + 1
            self._children[rank] = cached
        return cached

    def rank_stage(self, rank: int) -> str:
        return self.window.ranks[rank].stage

    # ------------------------------------------------------------- records
    def context_free_records(self, rank: int) -> list[Record]:
        """The records of a rule that binds in every stage, precision and grad mode: no
        context a reference happened to share, which would only blind it elsewhere."""
        return [{"rank": rank, "step_is_first": self.step == 0}]

    def window_record(self, rank: int) -> Record:
        return {"stage": self.rank_stage(rank), "step_is_first": self.step == 0, "rank": rank}

    def call_record(self, call: Mapping[str, Any], rank: int) -> Record:
        record: Record = {"stage": call.get("stage", ""), "rank": rank, "step_is_first": self.step == 0}
        for name in ("mtype", "training"):
            value = call.get(name)
            if value is not None:
                record[name] = value
        ctx = call.get("ctx")
        if ctx:
            for key, value in ctx.items():
                if (value is None or is_scalar(value)) and key not in FIRST_FORWARD_FACTS:
                    record[f"ctx.{key}"] = value
        args = call.get("args")
        if args:
            for key, value in args.items():
                # flags and short names (modes, reduce ops) can scope a rule; digests, paths
                # and other one-off strings would only multiply example shapes
                if isinstance(value, bool) or (isinstance(value, str) and _low_cardinality(value)):
                    record[f"args.{key}"] = value
        if call.get("exc"):
            record["raised"] = True
        return record

    def snapshot_record(self, attrs: Mapping[str, Any], rank: int) -> "SnapshotRecord":
        """`state_record` computed field by field, for checking (see `SnapshotRecord`)."""
        return SnapshotRecord(attrs, rank, self.step == 0)

    def state_record(self, attrs: Mapping[str, Any], rank: int) -> Record:
        get = attrs.get
        record: Record = {"stage": get("stage", ""), "rank": rank, "step_is_first": self.step == 0}
        # snapshot attributes of an unexpected type are "unknown", like missing ones
        # (unrolled: inference builds one record per variable site and effect)
        value = get("vtype")
        if isinstance(value, str):
            record["vtype"] = value
        value = get("mtype")
        if isinstance(value, str):
            record["mtype"] = value
        value = get("dtype")
        if isinstance(value, str):
            record["dtype"] = value
        value = get("requires_grad")
        if isinstance(value, bool):
            record["requires_grad"] = value
        value = get("is_leaf")
        if isinstance(value, bool):
            record["is_leaf"] = value
        if "grad_digest" in attrs or "grad_norm" in attrs:
            record["has_grad"] = get("grad_digest") is not None
            norm = get("grad_norm")
            if isinstance(norm, (int, float)) and not isinstance(norm, bool):
                record["grad_nonzero"] = norm > 0
                # A gradient many orders of magnitude below the weights (e.g. a conv bias
                # feeding a BatchNorm) can leave float32 weights bit-identical after a step.
                data_norm = get("data_norm")
                if isinstance(data_norm, (int, float)) and not isinstance(data_norm, bool):
                    record["grad_significant"] = norm > SIGNIFICANT_GRAD_RATIO * data_norm if data_norm > 0 else norm > 0
        return record


_ABSENT = object()
#: snapshot attributes copied into a state record when they have the expected type
_TYPED_SNAPSHOT_FIELDS: dict[str, type] = {"vtype": str, "mtype": str, "dtype": str, "requires_grad": bool,
                                           "is_leaf": bool}
_GRADIENT_FIELDS = frozenset({"has_grad", "grad_nonzero", "grad_significant"})


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class SnapshotRecord(Mapping[str, Any]):
    """The state record of one variable snapshot (`WindowView.state_record`), computed
    only for the fields that are read.

    Checking tests a precondition at every failing variable site (on a healthy run,
    every parameter of an optimizer step fails "gradient cleared" and is excused by
    ``grad_nonzero = False``); a precondition reads one or two fields, and building
    the whole record cost more than the rest of the site.  Iterating builds the
    whole record.  tests/unit/test_evaluate_equivalence.py checks every field against
    `WindowView.state_record` on arbitrary snapshots.
    """

    __slots__ = ("_attrs", "_rank", "_first_step")

    def __init__(self, attrs: Mapping[str, Any], rank: int, first_step: bool) -> None:
        self._attrs = attrs
        self._rank = rank
        self._first_step = first_step

    def get(self, name: str, default: Any = None) -> Any:
        attrs = self._attrs
        if name == "stage":
            return attrs.get("stage", "")
        if name == "rank":
            return self._rank
        if name == "step_is_first":
            return self._first_step
        kind = _TYPED_SNAPSHOT_FIELDS.get(name)
        if kind is not None:
            value = attrs.get(name)
            return value if isinstance(value, kind) else default
        if name not in _GRADIENT_FIELDS or ("grad_digest" not in attrs and "grad_norm" not in attrs):
            return default
        if name == "has_grad":
            return attrs.get("grad_digest") is not None
        norm = attrs.get("grad_norm")
        if not is_number(norm):
            return default
        if name == "grad_nonzero":
            return norm > 0
        data_norm = attrs.get("data_norm")
        if not is_number(data_norm):
            return default
        return norm > SIGNIFICANT_GRAD_RATIO * data_norm if data_norm > 0 else norm > 0

    def __getitem__(self, name: str) -> Any:
        value = self.get(name, _ABSENT)
        if value is _ABSENT:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._whole())

    def __len__(self) -> int:
        return len(self._whole())

    def _whole(self) -> Record:
        record: Record = {}
        for name in ("stage", "rank", "step_is_first", *_TYPED_SNAPSHOT_FIELDS, "has_grad", "grad_nonzero",
                     "grad_significant"):
            value = self.get(name, _ABSENT)
            if value is not _ABSENT:
                record[name] = value
        return record
