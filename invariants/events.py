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
#: documented contracts the producer evaluates (``ctx.contract``, see `CONTRACTS`).
CLIP_GRAD_NORM = "torch.nn.utils.clip_grad_norm_"
MODULE_LOAD_STATE_DICT = "torch.nn.Module.load_state_dict"
#: A learning-rate scheduler's step (``scheduler.step()``).
SCHEDULER_STEP = "torch.optim.lr_scheduler.LRScheduler.step"
#: A training pass over a DataLoader whose ``DistributedSampler`` shuffles (recorded only then).
DATALOADER_EPOCH = "torch.utils.data.DataLoader.__iter__"
#: Contracts of torch APIs that the producer evaluates on a call, where only the
#: program's live objects can tell (``ctx.contract`` maps each to kept or not):
#: ``unscaled_grads`` — ``clip_grad_norm_`` runs after ``GradScaler.unscale_`` in a step
#: that scaled its loss; ``replaces_weights`` — ``load_state_dict`` gives the module at
#: least one tensor that is not already its own; ``keeps_optimizer_state`` — an
#: optimizer step does not start over the state of an identical optimizer that stepped
#: the same trained parameters before it; ``reshuffles_each_epoch`` — a training pass over
#: a DataLoader whose ``DistributedSampler`` shuffles starts from another epoch than the
#: previous pass (``set_epoch`` was called); ``grads_reach_what_ran`` — of the trainable
#: parameters an optimizer step holds whose layers ran with gradients since the previous
#: step, most (by size) have a gradient (no ``.detach()`` cut them off the loss);
#: ``keeps_learning`` — an optimizer that has stepped with a positive learning rate does
#: not step twice in a row with every rate at zero (a schedule that ended early);
#: ``keeps_trained_weights`` — an optimizer does not step on with its state for weights that
#: a ``Module.load_state_dict`` has set back to their values before their first update;
#: ``optimizes_unfrozen`` — a parameter frozen when training began that takes a gradient
#: later (unfrozen) is held by an optimizer; ``frozen_norm_keeps_stats`` — a BatchNorm
#: forward in training mode with gradients has affine parameters that are not all frozen
#: (a frozen one would still move its running statistics); ``fresh_dataset_rng`` — a
#: DataLoader worker of a training pass does not start (after its ``worker_init_fn``) from
#: the dataset RNG state that an earlier training pass's workers started from;
#: ``clears_used_grads`` / ``module_clears_used_grads`` — an ``Optimizer.zero_grad`` /
#: ``Module.zero_grad`` does not clear finite gradients of an optimizer that has stepped
#: before which a backward produced since the last optimizer step (accumulation wiped);
#: ``keeps_weights_after_eval`` — an optimizer's first step after an evaluation finds the
#: weights it left at its previous step (weights swapped in for the evaluation were
#: swapped back), where its weights otherwise stay put between steps;
#: ``averages_accumulated_losses`` — an optimizer step does not take the sum of two or more
#: micro-batch losses that nothing rescaled (gradient accumulation without ``loss / k``);
#: ``resumes_schedule`` — a scheduler whose optimizer was resumed from a checkpoint does
#: not take its first step after the resume from epoch 0 (its state was left out);
#: ``steps_once_per_epoch`` — a ``StepLR``/``MultiStepLR`` stepped per iteration does not
#: lower the rate twice (or first) within one of the epochs the program shows, and one
#: stepped every few iterations is not then stepped after a single one (an epoch
#: schedule moved into the batch loop); ``compares_like_shapes`` — no subtraction in a
#: scalar loss's own arithmetic broadcasts a ``(B, 1)`` model output against a ``(B,)``
#: target into a ``(B, B)`` matrix (a hand-written squared error on mismatched shapes);
#: ``keeps_stored_samples`` — no batch fetched since an optimizer's previous step wrote
#: into the sample tensors its dataset stores for samples already fetched before
#: (in-place masking or augmentation of cached data); ``fresh_autocast_weights`` — no
#: training forward since an optimizer's previous step ran under autocast on casts it
#: cached before an optimizer stepped inside the same autocast region (stale weights);
#: ``keeps_frozen_weights`` — a step does not move a parameter the optimizer trained that
#: has been frozen since (a zero gradient kept by ``zero_grad(set_to_none=False)`` under
#: weight decay or momentum); ``carries_no_epoch_tail`` — a step whose accumulation cycle
#: began in an earlier training pass holds no more backwards than the optimizer's longest
#: cycle within one pass (an epoch's leftover micro-batches leaking into the next epoch);
#: ``keeps_cycle_across_epoch`` — a step whose cycle a clear at an epoch's start cut (it
#: discarded the previous epoch's backwards) holds as many backwards as its longest cycle
#: within one pass (an epoch-start clear in a loop that accumulates across epochs);
#: ``steps_own_grads`` — no backward that changed an optimizer's gradients and fed another
#: optimizer's step is followed, in the same cycle, by a backward of its own (a
#: discriminator stepping on what the generator's loss left in it); ``evaluates_fitted_norm``
#: — a BatchNorm forward in evaluation mode without gradients does not normalise with
#: running statistics still at their initial values while its affine parameters hold
#: learned ones (an EMA teacher or weight copy that averaged parameters but not buffers);
#: ``steps_schedule_with_optimizer`` — the rates an optimizer step uses were not moved since
#: its previous step by a schedule stepped more than once in between (a schedule stepped
#: on every micro-batch of gradient accumulation, or twice an epoch);
#: ``rescales_groups_alike`` — rates written by hand between two steps of an optimizer (no
#: schedule stepped) never raise a positive group's rate while lowering another's (one
#: rate written into every group of a discriminative setup); ``steps_clipped_grads`` — a
#: step right after a ``clip_grad_norm_`` applies gradients within its bound (a clip given
#: an exhausted iterator of parameters clips nothing); ``schedules_stepping_optimizer`` — the
#: optimizers schedules stepped since the previous optimizer step are still trained (not a
#: copy restored from a checkpoint, not one another optimizer replaced);
#: ``updates_move_average`` — writes into a half-precision deep copy of trained weights (an
#: EMA) move it where it differs from them; ``averages_once_per_step`` — such a copy is
#: not averaged between two backwards without an optimizer step (per micro-batch);
#: ``resumes_loaded_weights`` — an optimizer's first step after a resume steps no parameter
#: re-initialised (by an initialiser or its model's first training forward) since a load
#: gave it its values; ``anneals_within_horizon`` — every
#: ``CosineAnnealingLR`` the program stepped over the optimizer is within its ``T_max``;
#: ``steps_each_memory_once`` — no two parameters an optimizer holds are one memory;
#: ``replays_checkpoint_rng`` — no activation-checkpointed block that drew random numbers
#: since the previous step ran without preserving its RNG state for the recompute;
#: ``clears_between_evaluations`` — a backward in the second or later evaluation of an
#: optimizer step's closure (LBFGS) starts from gradients cleared since that evaluation began;
#: ``steps_whole_cycles`` — once a training pass began with a fixed accumulation over k >= 2
#: backwards per step (two cycles of one length), at most one of its steps (the tail) runs a
#: shorter cycle;
#: ``resumes_trained_parameters`` — an optimizer's first step after a resume steps only
#: parameters the checkpoint held state for, or ones frozen at the resume and unfrozen since;
#: ``freezes_through_parameters`` — no parameter a step updates belongs to a module whose own
#: ``requires_grad`` attribute (a no-op on a module) its parameters do not follow;
#: ``clips_whole_cycles`` — no clip since the previous step rescaled gradients of the
#: optimizer's parameters that a later backward then added to (clipping each micro-batch).
CONTRACTS: dict[str, str] = {
    "unscaled_grads": CLIP_GRAD_NORM,
    "replaces_weights": MODULE_LOAD_STATE_DICT,
    "keeps_optimizer_state": OPTIMIZER_STEP,
    "grads_reach_what_ran": OPTIMIZER_STEP,
    "keeps_learning": OPTIMIZER_STEP,
    "keeps_trained_weights": OPTIMIZER_STEP,
    "optimizes_unfrozen": OPTIMIZER_STEP,
    "keeps_weights_after_eval": OPTIMIZER_STEP,
    "averages_accumulated_losses": OPTIMIZER_STEP,
    "keeps_stored_samples": OPTIMIZER_STEP,
    "fresh_autocast_weights": OPTIMIZER_STEP,
    "keeps_frozen_weights": OPTIMIZER_STEP,
    "freezes_through_parameters": OPTIMIZER_STEP,
    "carries_no_epoch_tail": OPTIMIZER_STEP,
    "keeps_cycle_across_epoch": OPTIMIZER_STEP,
    "steps_whole_cycles": OPTIMIZER_STEP,
    "steps_own_grads": OPTIMIZER_STEP,
    "steps_schedule_with_optimizer": OPTIMIZER_STEP,
    "rescales_groups_alike": OPTIMIZER_STEP,
    "steps_clipped_grads": OPTIMIZER_STEP,
    "clips_whole_cycles": OPTIMIZER_STEP,
    "schedules_stepping_optimizer": OPTIMIZER_STEP,
    "updates_move_average": OPTIMIZER_STEP,
    "averages_once_per_step": OPTIMIZER_STEP,
    "resumes_loaded_weights": OPTIMIZER_STEP,
    "resumes_trained_parameters": OPTIMIZER_STEP,
    "anneals_within_horizon": OPTIMIZER_STEP,
    "steps_each_memory_once": OPTIMIZER_STEP,
    "replays_checkpoint_rng": OPTIMIZER_STEP,
    "resumes_schedule": SCHEDULER_STEP,
    "steps_once_per_epoch": SCHEDULER_STEP,
    "compares_like_shapes": TENSOR_BACKWARD,
    "clears_between_evaluations": TENSOR_BACKWARD,
    "frozen_norm_keeps_stats": MODULE_FORWARD,
    "evaluates_fitted_norm": MODULE_FORWARD,
    "reshuffles_each_epoch": DATALOADER_EPOCH,
    "fresh_dataset_rng": WORKER_INIT_API,
    "clears_used_grads": OPTIMIZER_ZERO_GRAD,
    "module_clears_used_grads": MODULE_ZERO_GRAD,
}

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
