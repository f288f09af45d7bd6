"""Which API call carries each documented contract the producer judges (``ctx.contract``).

The checker's `ApiContract` relation reads a contract only on the API listed here; the
producer evaluates it on that call, where only the training process can see the facts.
"""

from __future__ import annotations

from .events import (
    CLIP_GRAD_NORM,
    DATALOADER_EPOCH,
    MODULE_FORWARD,
    MODULE_LOAD_STATE_DICT,
    MODULE_ZERO_GRAD,
    OPTIMIZER_STEP,
    OPTIMIZER_ZERO_GRAD,
    SCHEDULER_STEP,
    TENSOR_BACKWARD,
    WORKER_INIT_API,
)

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
