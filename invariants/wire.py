"""Typed decoding of batches for the checkers' hot path.

`codec.decode_batch` turns a message into plain dicts and then validates every event
in Python.  For a checker that is most of the cost of a message: allocating a dict
per event and per attribute map, walking them again to validate, and freeing them
again after the fold has copied out the few facts it keeps.  Here the contract of
`events` is written as msgspec types instead, so one C pass validates the envelope and
the kind-specific fields while it decodes, builds one slotted object per event, and
skips — without allocating — the fields no checker reads.  Snapshot attribute maps
are decoded into only the attributes the deployed invariants (and the step summary)
look at, so the fold keeps the decoded map as it is instead of copying it.

Equivalence with `decode_batch` is the rule: a message is accepted here exactly when
it is accepted there.  Anything msgspec rejects is handed to `decode_batch`, which
produces the precise `SchemaError` reason and message the dead-letter topic and the
metrics use.  (One tightening: snapshot attribute names must be strings, which every
producer sends; a map with other keys is rejected as ``wrong_type``.)

Field types: the contract's required fields are typed exactly (``int`` rejects bools
and floats as the Python validator does); optional ones are ``Any`` so that the typed
path is never stricter than the dict path.  `UNSET` marks an optional field that was
absent, where absent and None mean different things (a call's return value).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, Iterable, Literal, Mapping, TypedDict, Union

import msgpack
import msgspec

from .codec import MAX_BATCH_BYTES, _extension, decode_batch, decode_bounded
from .events import SUPPORTED_VERSIONS, SchemaError, check_bounds

UNSET: Any = msgspec.UNSET


class _Envelope(msgspec.Struct, tag_field="kind", gc=False):
    """The fields every event carries; ``kind`` is the tag that picks the subclass."""

    t: int
    pid: int
    tid: int
    stage: str


class CallEvent(_Envelope, tag="call"):
    """The value summaries (``args``, ``kwargs``, ``ret``, ``ctx``) stay encoded until
    read (`payload`): most calls are of APIs no deployed invariant names, and building
    their nested maps was the largest part of decoding a call."""

    KIND: ClassVar[str] = "call"
    name: str
    phase: Literal["pre", "post", "exc"]
    cid: int
    api: Any = None
    parent: Any = None
    args: msgspec.Raw = None  # type: ignore[assignment]
    kwargs: msgspec.Raw = None  # type: ignore[assignment]
    ret: msgspec.Raw = UNSET
    exc: Any = None
    msg: Any = None
    ctx: msgspec.Raw = None  # type: ignore[assignment]
    module: Any = None
    mtype: Any = None
    training: Any = None
    #: the receiver's stable id (``opt<i>``, ``m<i>``), the optimizers a
    #: ``Module.zero_grad`` clears, whether an initialiser's target was trained or held
    #: learned values (trained, or loaded from a state dict), and whether an optimizer's
    #: gradients were cleared since its previous step, and whether any backward pass ran
    #: in the process before an optimizer step (``backprop``) and since the optimizer's
    #: previous step (``fed``)
    obj: Any = None
    clears: Any = None
    trained: Any = None
    cleared: Any = None
    learned: Any = None
    backprop: Any = None
    fed: Any = None


class StateEvent(_Envelope, tag="state"):
    """``attrs`` holds every attribute here; a plan's decoder narrows it (`wire_types`)."""

    KIND: ClassVar[str] = "state"
    name: str
    attrs: dict[str, Any]
    at: Any = None
    vtype: Any = UNSET
    cid: Any = None


class StepEvent(_Envelope, tag="step"):
    """``setup``/``trained``/``boundary`` say what the window held (the run model's
    setup window and training iterations); producers before it send none of them."""

    KIND: ClassVar[str] = "step"
    phase: Literal["begin", "end"]
    final: Any = None
    setup: Any = None
    trained: Any = None
    boundary: Any = None
    #: the producer took no parameter snapshots in this window (sampling)
    unsampled: Any = None


class MetaEvent(_Envelope, tag="meta"):
    """Only the meta fields a checker acts on; the rest (versions, argv) is skipped."""

    KIND: ClassVar[str] = "meta"
    what: str
    workers: Any = None
    dropped_events: Any = None
    dropped_batches: Any = None
    #: ``run_end``: what the process did, for the coverage of a verdict
    iterations: Any = None
    optimizer_steps: Any = None
    #: ``run_end``: optimizer and clipping calls a trainer made without a backward, on
    #: purpose, that the producer did not record (`producers.trainer_passes`)
    left_out_calls: Any = None
    #: ``run_end``: the rank never synchronised gradients with the others (federated
    #: averaging, an ensemble), so its parameters were not compared across ranks
    separate_models: Any = None
    #: ``run_start``: recording settings (``sample_every``)
    config: Any = None
    #: ``producer_stats`` under an overhead budget: the budget and the share measured
    overhead_budget: Any = None
    overhead_share: Any = None

    def stats(self) -> dict[str, Any]:
        """The producer counters of a ``producer_stats`` event, as the metrics read them."""
        return {"dropped_events": self.dropped_events, "dropped_batches": self.dropped_batches,
                "overhead_share": self.overhead_share}


WireEvent = Union[CallEvent, StateEvent, StepEvent, MetaEvent]


class WireBatch(msgspec.Struct, gc=False):
    v: int
    run: str
    rank: int
    world: int
    step: int
    seq: int
    events: list[WireEvent]
    pid: Any = None


@dataclass(frozen=True)
class WireTypes:
    """The batch type of one attribute selection and the decoder/converter built on it."""

    batch: type
    state: type
    decoder: msgspec.msgpack.Decoder

    def decode(self, payload: bytes, *, max_bytes: int = MAX_BATCH_BYTES) -> Any:
        """Decode and validate one message; every failure is a `SchemaError`."""
        if len(payload) > max_bytes:
            raise SchemaError("oversized", f"batch of {len(payload)} bytes exceeds {max_bytes}")
        try:
            batch = decode_bounded(self.decoder, payload)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            decode_batch(payload, max_bytes=max_bytes)  # raises the contract's own reason
            raise SchemaError("wrong_type", f"batch: {exc}") from None
        return _check_header(batch)

    def convert(self, batch: Mapping[str, Any]) -> Any:
        """An in-memory dict batch (tests, synthetic runs) as this selection's type: it
        goes through the wire encoding, so it is read exactly as a message would be."""
        # datetime=True: a batch that was itself decoded may hold timestamps as datetimes
        encoded = msgpack.packb(batch, use_bin_type=True, datetime=True)
        return self.decode(encoded, max_bytes=len(encoded))


#: Decodes a call's value summaries when they are read (same values as `decode_batch`).
_PAYLOAD_DECODER = msgspec.msgpack.Decoder(ext_hook=_extension)


def payload(value: Any) -> Any:
    """The value of a call's ``args``/``kwargs``/``ret``/``ctx``: absent stays None or `UNSET`."""
    if value is None or value is UNSET:
        return value
    return decode_bounded(_PAYLOAD_DECODER, value)


def _check_header(batch: Any) -> Any:
    """The value checks `validate_batch` makes beyond types."""
    if batch.v not in SUPPORTED_VERSIONS:
        raise SchemaError(
            "unknown_version",
            f"batch schema version {batch.v} is not supported (this build reads {sorted(SUPPORTED_VERSIONS)})",
        )
    check_bounds(batch.rank, batch.world, batch.step)
    return batch


def wire_types(attr_names: Iterable[str] | None = None) -> WireTypes:
    """Types decoding snapshot attributes ``attr_names`` only (all of them for None)."""
    return _wire_types(None if attr_names is None else frozenset(attr_names))


@lru_cache(maxsize=16)
def _wire_types(attr_names: frozenset[str] | None) -> WireTypes:
    if attr_names is None:
        state: type = StateEvent
        batch: type = WireBatch
    else:
        # Unknown keys of a TypedDict are skipped by the decoder: the map holds only
        # the selected attributes, so the fold can keep it without copying.
        attrs = TypedDict("SelectedAttrs", {name: Any for name in sorted(attr_names)}, total=False)  # type: ignore[misc]
        state = msgspec.defstruct(
            "SelectedStateEvent", [("attrs", attrs)], bases=(StateEvent,),
            tag_field="kind", tag="state", gc=False,
        )
        batch = msgspec.defstruct(
            "SelectedWireBatch", [("events", list[Union[CallEvent, state, StepEvent, MetaEvent]])],  # type: ignore[valid-type]
            bases=(WireBatch,), gc=False,
        )
    return WireTypes(batch=batch, state=state, decoder=msgspec.msgpack.Decoder(batch, ext_hook=_extension))
