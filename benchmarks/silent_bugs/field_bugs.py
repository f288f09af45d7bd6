"""Reproductions of mistakes reported in public issue trackers and forums (data only)."""

from __future__ import annotations

from bug_cases import TORCHRUN_2, BugCase

#: Reproductions of mistakes reported in public issue trackers and forums, one program
#: each, chosen to widen the set of root-cause classes. ``gap`` says, for those the shipped
#: default set misses, what invariant or recorded fact would catch them.
FIELD_BUGS: tuple[BugCase, ...] = (
    BugCase(
        "detached_backbone_features", "backbone features detached before the head; the backbone stops training",
        "queenie88/A-GCN-4", ("backbone", "detach", "grad"),
        "ApiContract (gradients reach most of the layers that ran with gradients)",
        cause_class="computation graph cut by detach",
    ),
    BugCase(
        "layers_in_python_list", "new adapter kept in a plain list; never registered, never trained",
        "pytorch/pytorch-715", ("adapters", "Linear", "ModuleList"),
        "ModuleRegistration (layers run in a model's forward are registered or trained)",
        cause_class="submodule not registered",
    ),
    BugCase(
        "functional_dropout_in_eval", "F.dropout without training=self.training; dropout on during validation",
        "pytorch/pytorch-26338", ("dropout", "training"), "TrainingFlag (F.dropout in stage eval)",
        cause_class="dropout active at evaluation",
    ),
    BugCase(
        "eval_without_eval_mode", "evaluation under no_grad but in training mode; BatchNorm stats updated on validation data",
        "fxia22/pointnet.pytorch-19", ("eval", "BatchNorm", "training"), "TrainingFlag (no-grad forwards run in eval mode)",
        cause_class="BatchNorm statistics updated by evaluation data",
    ),
    BugCase(
        "step_in_validation", "validation loop keeps backward() and optimizer.step(); trains on validation data",
        "SKrisanski/FSCT-12", ("Optimizer.step", "backward", "stage 'eval'"), "APIAbsent (no step in stage eval)",
        cause_class="training on validation data",
    ),
    BugCase(
        "optimizer_recreated_each_epoch", "Adam re-created every epoch; moment estimates reset",
        "gaohongkui/GlobalPointer_pytorch-7", ("Optimizer", "Adam", "state"),
        "ApiContract (no identical optimizer rebuilt over the parameters it trains)",
        cause_class="optimizer state reset",
    ),
    BugCase(
        "ranks_init_unsynced", "fresh head drawn from a per-rank-seeded generator and not broadcast; replicas differ",
        "antoyang/TubeDETR-15 / sparticlesteve/pytorch-benchmarks-1", ("2.weight", "2.bias", "broadcast"),
        "Consistent (parameters equal across ranks)", launch=TORCHRUN_2,
        cause_class="replicas initialised differently",
    ),
    BugCase(
        "lr_diverges_across_ranks", "learning rate from rank-local data progress; ranks step with different rates",
        "karpathy/nanochat-857", ("Optimizer.step", "lr", "0.weight", "2.weight"),
        "APIArg (optimizer hyperparameters equal across ranks)", launch=TORCHRUN_2,
        cause_class="per-rank hyperparameter divergence",
    ),
    BugCase(
        "load_prefix_mismatch", "checkpoint keys prefixed with 'module.' merged into the model's own; nothing loaded",
        "StackOverflow-61854165", ("load_state_dict", "module."),
        "ApiContract (a restore hands the module tensors it does not hold)",
        cause_class="checkpoint silently not loaded",
    ),
    BugCase(
        "loss_requires_grad_hack", "loss computed under no_grad, then loss.requires_grad = True; no parameter gets a gradient",
        "ronghuaiyang/arcface-pytorch-56", ("Optimizer.step", "requires_grad"), "EventContain (step changes parameters)",
        cause_class="graph broken, backward forced to run",
    ),
    BugCase(
        "double_softmax", "model outputs softmax probabilities into cross_entropy",
        "ariecattan/SciCo-2", ("softmax", "cross_entropy"), "LossArguments (loss input is not probabilities)",
        cause_class="loss input convention violated",
    ),
    BugCase(
        "mse_broadcast_target", "target (N,) against prediction (N, 1); MSE broadcasts to (N, N)",
        "pytorch/pytorch-16045", ("mse_loss", "target"), "LossArguments (loss input and target shapes equal)",
        cause_class="loss target broadcast",
    ),
    BugCase(
        "amp_clip_scaled_grads", "clip_grad_norm_ on GradScaler-scaled gradients (unscale_ dropped)",
        "milesial/Pytorch-UNet-468", ("clip_grad_norm_", "unscale_", "GradScaler"),
        "ApiContract (clip_grad_norm_ after GradScaler.unscale_)",
        cause_class="AMP gradients clipped while scaled",
    ),
    BugCase(
        "clip_before_backward", "clip_grad_norm_ called between zero_grad() and backward(); clips nothing",
        "Cranial-XIX/FAMO-4", ("clip_grad_norm_", "backward"), "APISequence (backward before clip)",
        cause_class="gradient clipping misplaced",
    ),
    BugCase(
        "clip_after_step", "clip_grad_norm_ called after optimizer.step(); every update unclipped",
        "VGraphRNN/VGRNN-4", ("clip_grad_norm_", "Optimizer.step"), "APISequence (clip before step)",
        cause_class="gradient clipping misplaced",
    ),
    BugCase(
        "validation_backward_leaks_grads", "validation loss back-propagated; its gradients added to the next training step",
        "harvardnlp/annotated-transformer-14", ("backward", "stage 'eval'"), "APIAbsent (no backward in stage eval)",
        cause_class="validation gradients leak into training",
    ),
    BugCase(
        "scheduler_stepped_per_batch", "epoch-based StepLR stepped every batch; learning rate collapses",
        "hazdzz/stgcn-18", ("LRScheduler.step", "lr"), "APISequence (scheduler steps once per epoch)",
        cause_class="learning-rate schedule stepped at the wrong frequency",
        gap="steps_once_per_epoch reports it two windows late: the onset iteration also steps in the healthy twin, so "
            "the first differing call comes one iteration later",
    ),
    BugCase(
        "frozen_bn_stats_updated", "backbone frozen with requires_grad=False; its BatchNorm running stats keep moving",
        "pytorch/pytorch-86590 / lightly-ai/lightly-1438", ("BatchNorm", "running_mean", "backbone"),
        "ApiContract (a BatchNorm layer whose parameters are all frozen runs in eval mode)",
        cause_class="frozen BatchNorm statistics still updated",
    ),
    BugCase(
        "distributed_sampler_no_set_epoch", "DistributedSampler.set_epoch not called; every epoch replays the same order",
        "pytorch/pytorch-31771", ("set_epoch", "DistributedSampler"),
        "ApiContract (a new sampler epoch per training pass)", launch=TORCHRUN_2,
        cause_class="data order not reshuffled across epochs",
    ),
)
