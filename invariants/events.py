"""The event model: what a training process says about itself, per rank and step.

This module is the wire contract between producers and checkers (docs/design.md,
"The wire contract").
Producers build events as plain dicts and lists, which is what msgpack encodes for
free; the validators here turn untrusted decoded input into a precise `SchemaError`
instead of a `KeyError` deep inside a relation.  Checkers decode the same contract
into typed structs (`invariants.wire`), which validate while they decode and must
accept exactly what these validators accept.

A *batch* is the unit on the wire and in trace files::

    {"v": 1, "run": "r1", "rank": 0, "world": 2, "step": 7, "seq": 12,
     "events": [event, ...]}

Every event carries ``kind``, ``t`` (wall-clock ns), ``pid``, ``tid``, ``stage`` and
kind-specific fields:

``call``   ``name`` (qualified API name), ``phase`` (``pre`` | ``post`` | ``exc``),
           ``cid`` (call id, unique per process; ``pre`` and ``post`` share it),
           ``parent`` (cid of the enclosing recorded call or None), ``args``
           (name -> value summary), ``ret`` (summary, ``post`` only), ``exc`` and
           ``msg`` (``exc`` only), ``ctx`` (active context, e.g. autocast dtype,
           grad mode).
``state``  ``name`` (variable name, e.g. ``model.fc.weight``), ``vtype`` (e.g.
           ``torch.nn.Parameter``), ``at`` (where the snapshot was taken, e.g.
           ``pre:torch.optim.Adam.step``), ``cid`` (the call it brackets, if any),
           ``attrs`` (shape, dtype, device, requires_grad, data/grad digests, norms).
``step``   ``phase`` (``begin`` | ``end``).
``meta``   ``what`` (``run_start`` | ``run_end`` | ``producer_stats`` |
           ``dataloader_workers`` | ...), plus free-form fields (versions, argv,
           dropped event counts; ``workers``: how many DataLoader workers this step
           started, each of which sends one batch holding its
           ``torch.utils.data.worker_init`` call for the same step).

A value summary is a scalar (None, bool, int, float, str), a short list of
summaries, or a dict with a ``"T"`` key naming the summarised type (``"tensor"``
with shape/dtype/device/requires_grad, ``"obj"`` with the type name, ...).
"""

from __future__ import annotations

from typing import Any, Mapping

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})

EVENT_KINDS = frozenset({"call", "state", "step", "meta"})
CALL_PHASES = frozenset({"pre", "post", "exc"})
STEP_PHASES = frozenset({"begin", "end"})

#: The largest job a batch may declare.  Completeness checks and reports scale with
#: the declared world size, so an absurd one (a bug or a hostile sender) is rejected
#: here as ``bad_value`` instead of costing every consumer work and memory per rank.
MAX_WORLD = 65_536

Batch = dict[str, Any]
Event = dict[str, Any]

_BATCH_FIELDS: dict[str, type | tuple[type, ...]] = {
    "v": int,
    "run": str,
    "rank": int,
    "world": int,
    "step": int,
    "seq": int,
    "events": list,
}
_EVENT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "kind": str,
    "t": int,
    "pid": int,
    "tid": int,
    "stage": str,
}
_KIND_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "call": {"name": str, "phase": str, "cid": int},
    "state": {"name": str, "attrs": dict},
    "step": {"phase": str},
    "meta": {"what": str},
}


class SchemaError(ValueError):
    """Input that does not follow the event contract.

    ``reason`` is a short, stable, label-safe word (used as a metric label and in
    dead-letter records); the message says exactly which field was wrong.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def batch_key(run: str, step: int) -> bytes:
    """Kafka key that puts every rank's events of one step on the same partition."""
    return f"{run}:{step}".encode()


def make_batch(
    *, run: str, rank: int, world: int, step: int, seq: int, events: list[Event]
) -> Batch:
    return {
        "v": SCHEMA_VERSION,
        "run": run,
        "rank": rank,
        "world": world,
        "step": step,
        "seq": seq,
        "events": events,
    }


def _check_fields(obj: Mapping[str, Any], spec: Mapping[str, Any], where: str) -> None:
    for field, expected in spec.items():
        if field not in obj:
            raise SchemaError("missing_field", f"{where}: missing field {field!r}")
        value = obj[field]
        # bool is an int subclass; a bool where an int is expected is a bug upstream.
        if expected is int and isinstance(value, bool):
            raise SchemaError("wrong_type", f"{where}: field {field!r} must be int, got bool")
        if not isinstance(value, expected):
            raise SchemaError(
                "wrong_type",
                f"{where}: field {field!r} must be "
                f"{getattr(expected, '__name__', expected)}, got {type(value).__name__}",
            )


def validate_event(event: Any, where: str = "event") -> Event:
    """Check one event's envelope and kind-specific fields; return it unchanged."""
    if not isinstance(event, dict):
        raise SchemaError("wrong_type", f"{where}: must be a map, got {type(event).__name__}")
    _check_fields(event, _EVENT_FIELDS, where)
    kind = event["kind"]
    if kind not in EVENT_KINDS:
        raise SchemaError("unknown_kind", f"{where}: unknown kind {kind!r}")
    _check_fields(event, _KIND_FIELDS[kind], f"{where} ({kind})")
    if kind == "call" and event["phase"] not in CALL_PHASES:
        raise SchemaError("bad_value", f"{where}: call phase {event['phase']!r} is not pre/post/exc")
    if kind == "step" and event["phase"] not in STEP_PHASES:
        raise SchemaError("bad_value", f"{where}: step phase {event['phase']!r} is not begin/end")
    return event


# Fast-path tables: (field, exact type) pairs per kind, envelope included.  msgpack
# decodes ints as `int` and strings as `str` exactly, so `type(x) is T` is a correct
# and much cheaper test than `isinstance` here; anything unusual falls through to the
# slow path, which produces the precise error message.
_FAST_EVENT_SPEC: dict[str, tuple[tuple[str, type], ...]] = {
    kind: tuple((f, t) for f, t in {**_EVENT_FIELDS, **fields}.items())  # type: ignore[misc]
    for kind, fields in _KIND_FIELDS.items()
}
_FAST_PHASES: dict[str, frozenset[str]] = {"call": CALL_PHASES, "step": STEP_PHASES}


def _event_is_valid(event: Any) -> bool:
    """True when the event certainly passes `validate_event` (checking is the hot path
    of every consumer: it runs once per event of every batch)."""
    if type(event) is not dict:
        return False
    kind = event.get("kind")
    spec = _FAST_EVENT_SPEC.get(kind) if type(kind) is str else None
    if spec is None:
        return False
    for field, expected in spec:
        if type(event.get(field)) is not expected:
            return False
    phases = _FAST_PHASES.get(event["kind"])
    return phases is None or event["phase"] in phases


def check_bounds(rank: int, world: int, step: int) -> None:
    """The value checks of a batch header, shared by the dict and the typed decoders."""
    if world > MAX_WORLD:
        raise SchemaError("bad_value", f"batch: world size {world} exceeds the maximum of {MAX_WORLD} ranks")
    if rank < 0 or world < 1 or rank >= world:
        raise SchemaError("bad_value", f"batch: rank {rank} is outside world size {world}")
    if step < 0:
        raise SchemaError("bad_value", f"batch: negative step {step}")


def validate_batch(batch: Any) -> Batch:
    """Check a decoded batch against the contract; return it unchanged.

    Raises `SchemaError` with reason ``unknown_version`` for a version this build
    cannot read, so that a newer producer's output is dead-lettered rather than
    misread.
    """
    if not isinstance(batch, dict):
        raise SchemaError("wrong_type", f"batch must be a map, got {type(batch).__name__}")
    version = batch.get("v")
    if isinstance(version, int) and not isinstance(version, bool):
        if version not in SUPPORTED_VERSIONS:
            raise SchemaError(
                "unknown_version",
                f"batch schema version {version} is not supported "
                f"(this build reads {sorted(SUPPORTED_VERSIONS)})",
            )
    _check_fields(batch, _BATCH_FIELDS, "batch")
    check_bounds(batch["rank"], batch["world"], batch["step"])
    for index, event in enumerate(batch["events"]):
        if not _event_is_valid(event):
            validate_event(event, f"batch.events[{index}]")
    return batch


# Names on the wire.  Producers write them and the invariants match on them, so each
# is defined here once: a name spelled differently on the two sides is a rule that
# silently never fires.

#: API families (the ``name`` of ``call`` events) that producers and checkers both
#: single out: step boundaries, gradient clears, mode switches, forwards.
OPTIMIZER_STEP = "torch.optim.Optimizer.step"
OPTIMIZER_ZERO_GRAD = "torch.optim.Optimizer.zero_grad"
MODULE_FORWARD = "torch.nn.Module.forward"
MODULE_TRAIN = "torch.nn.Module.train"
MODULE_EVAL = "torch.nn.Module.eval"
MODULE_ZERO_GRAD = "torch.nn.Module.zero_grad"
TENSOR_BACKWARD = "torch.Tensor.backward"
AUTOGRAD_BACKWARD = "torch.autograd.backward"
BACKWARD_APIS = frozenset({TENSOR_BACKWARD, AUTOGRAD_BACKWARD})
#: In-place writes on a parameter outside an optimizer step (see `producers.identity_hooks`).
PARAM_OVERWRITE = "torch.Tensor.param_overwrite"
#: Gradients cleared by user code without a ``zero_grad`` API (``p.grad = None``,
#: ``p.grad.zero_()``): one call per iteration; ``clears`` as for ``Module.zero_grad``.
GRAD_CLEAR_API = "torch.Tensor.grad_clear"
#: The call a DataLoader worker reports its seeds with, and the meta event by which the
#: rank that forked the workers announces them (see the ``meta`` kind above).
WORKER_INIT_API = "torch.utils.data.worker_init"
#: Gradient clipping by norm, and restoring a module from a state dict: calls whose
#: documented contracts the producer evaluates (``ctx.contract``, see `invariants.contract_apis`).
CLIP_GRAD_NORM = "torch.nn.utils.clip_grad_norm_"
MODULE_LOAD_STATE_DICT = "torch.nn.Module.load_state_dict"
#: A learning-rate scheduler's step (``scheduler.step()``).
SCHEDULER_STEP = "torch.optim.lr_scheduler.LRScheduler.step"
#: A training pass over a DataLoader whose ``DistributedSampler`` shuffles (recorded only then).
DATALOADER_EPOCH = "torch.utils.data.DataLoader.__iter__"

#: Optimizers are named ``opt<i>`` on the wire (``obj`` of their calls, ``clears`` of a
#: ``zero_grad``), in the order the producer first saw them.
OPTIMIZER_ID_PREFIX = "opt"


def optimizer_id(index: int) -> str:
    return f"{OPTIMIZER_ID_PREFIX}{index}"


#: The ``vtype`` of a parameter's ``state`` event.
PARAMETER_VTYPE = "torch.nn.Parameter"

#: ``what`` of the ``meta`` events the checkers act on.
RUN_START_META = "run_start"
RUN_END_META = "run_end"
PRODUCER_STATS_META = "producer_stats"
DATALOADER_WORKERS_META = "dataloader_workers"

#: Kafka topics (DESIGN §2) are a deployment's prefix followed by these names.
DEFAULT_TOPIC_PREFIX = "trainwatch."
EVENTS_TOPIC = "events"
VIOLATIONS_TOPIC = "violations"
STEP_SUMMARIES_TOPIC = "step-summaries"
DEAD_LETTER_TOPIC = "dead-letter"
