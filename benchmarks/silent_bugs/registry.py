"""The silent-bug benchmark's registry: one record per reproduction.

The registry is data, not logic: ``run.py`` and the tests read it to know how to launch
each reproduction, where its bug starts, which API or variable is the root cause (to
judge whether the top violation points at it) and which invariant relation is expected
to catch it. ``python registry.py`` prints it as JSON for tools outside Python.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent

SINGLE = "single"
TORCHRUN_2 = "torchrun-2"


@dataclass(frozen=True)
class BugCase:
    id: str
    title: str
    #: The documented public case the reproduction is modelled on.
    source: str
    #: Names (API families, variable-name fragments) a violation should mention to count
    #: as pointing at the root cause; matched case-insensitively as substrings.
    root_cause: tuple[str, ...]
    #: The invariant relation expected to catch it (a template name in docs/invariants.md).
    expected_relation: str
    launch: str = SINGLE
    onset: int = 3
    steps: int = 6
    notes: str = ""
    #: Why the shipped default set cannot catch it today (see GAPS.md), if it cannot.
    gap: str = ""
    script: str = field(default="")
    #: The root-cause class (one short phrase): reproductions sharing it are the same
    #: mistake in different programs; the benchmark counts classes and can hold one out.
    cause_class: str = ""
    #: The bug lives in the setup window (construction, initialisation, DataLoader start-up)
    #: of a program that never trains: it is live from trace step 0 and ``onset`` is unused.
    in_setup: bool = False

    @property
    def path(self) -> Path:
        return HERE / (self.script or f"{self.id}.py")

    def command(self, python: str, *, bug: bool, seed: int = 0, steps: int | None = None) -> list[str]:
        """The training command, ready to be run under ``trainwatch collect -- ...``."""
        launcher = [python] if self.launch == SINGLE else [
            python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        ]
        flags = ["--onset", str(self.onset), "--steps", str(steps or self.steps), "--seed", str(seed)]
        return launcher + [str(self.path)] + flags + (["--bug"] if bug else [])


BUGS: tuple[BugCase, ...] = (
    BugCase(
        "missing_zero_grad", "optimizer.zero_grad() no longer called; gradients accumulate",
        "StackOverflow-60335387", ("zero_grad",), "APISequence",
        cause_class="gradients not cleared between iterations",
    ),
    BugCase(
        "optimizer_wrong_params", "optimizer rebuilt over the frozen backbone instead of the head",
        "PyTorch-forum-84911", ("Optimizer.step", "head.weight", "head.bias"), "EventContain",
        cause_class="optimizer holds the wrong parameters",
    ),
    BugCase(
        "ddp_raw_module", "raw module called instead of the DDP wrapper; replicas drift",
        "x-jxmnop-ddp-out-of-sync", ("DistributedDataParallel", "0.weight", "0.bias", "2.weight", "2.bias"), "Consistent", launch=TORCHRUN_2,
        cause_class="data-parallel gradient sync bypassed",
    ),
    BugCase(
        "ddp_lost_sync_hooks", "parameters replaced under DDP; gradients no longer all-reduced",
        "PyTorch-104336", ("DistributedDataParallel", "0.weight", "0.bias", "2.weight", "2.bias"), "Consistent", launch=TORCHRUN_2,
        cause_class="data-parallel gradient sync bypassed",
    ),
    BugCase(
        "bf16_clip_one_rank", "bf16 grad clipping on one tensor-parallel rank only; LayerNorm diverges",
        "DeepSpeed-1801 (BLOOM-176B)", ("norm.weight", "norm.bias", "clip_grad_norm_"), "Consistent",
        launch=TORCHRUN_2, notes="sharded params carry tensor_model_parallel=True and differ across ranks by design",
        cause_class="gradient transform applied on one rank only",
    ),
    BugCase(
        "allreduce_corruption", "received all-reduce buffer corrupted on one rank",
        "PyTorch-84803 / PyTorch-96600 / Baichuan2-86", ("all_reduce", "0.weight", "0.bias", "2.weight", "2.bias"), "Consistent",
        launch=TORCHRUN_2,
        cause_class="collective communication corrupted",
    ),
    BugCase(
        "eval_dropout_attention", "attention kernel applies dropout during evaluation",
        "Transformers-33844", ("dropout",), "APIArg (training flag)",
        cause_class="dropout active at evaluation",
    ),
    BugCase(
        "spectral_norm_eval_first", "spectral-norm layer evaluated before its first training forward",
        "PyTorch-51800", ("grown", "spectral"), "TrainingFlag (first forward)",
        notes="only one step is affected; the signal is a module's first forward happening in eval mode "
              "(the producer marks first forwards and spectral-norm hooks in the call's ctx)",
        cause_class="stateful layer first run in the wrong mode",
    ),
    BugCase(
        "freeze_only_in_train", "stage freezing only applied inside train(); stem keeps training",
        "MMPretrain-702", ("stem", "_freeze_stages"), "EventContain",
        gap='GAPS "Open": nothing changes at the onset; the intent is a user attribute (frozen_stages) whose meaning is the backbone\'s own convention',
        cause_class="freezing not applied",
    ),
    BugCase(
        "reinit_every_step", "weights re-initialised with nn.init every step",
        "Transformers-17877", ("torch.nn.init",), "APIArg / APIAbsent-in-stage",
        cause_class="trained weights re-initialised",
    ),
    BugCase(
        "dataloader_same_augmentation", "DataLoader workers share one numpy RNG state",
        "StackOverflow-67180955", ("worker_init", "numpy"), "APIArg (distinct across workers)",
        cause_class="DataLoader worker RNG not reseeded",
    ),
    BugCase(
        "autocast_skipped", "a block escapes autocast and returns fp32",
        "Lightning-Thunder-725", ("ReLU", "block.act", "MLPBlock"), "APIOutput",
        cause_class="mixed-precision region escaped",
        gap="'a layer's output is bfloat16 under an active autocast' is learnt per layer type, and no layer type "
            "runs under autocast in 3 reference styles yet (shipping rules)",
    ),
    BugCase(
        "generate_ignores_max_new_tokens", "generation produces more than max_new_tokens",
        "Transformers-23723", ("max_new_tokens", "GreedySampler"), "APIOutput (bounded by argument)",
        cause_class="output bound argument ignored",
        gap="'generated length never exceeds max_new_tokens' is supported by one reference pipeline "
            "(gpt_tied_lm); the shipping rules need three",
    ),
    BugCase(
        "preprocess_batch_size", "preprocessing collapses the batch to one sample",
        "Transformers-34204", ("Preprocessor", "batch size"), "APIOutput (shape equals input)",
        notes="caught by the type-free rule: a module whose output keeps its input's rank keeps its batch size",
        cause_class="batch dimension collapsed",
    ),
    BugCase(
        "step_ignored_after_set_to_none", "optimizer step silently does nothing after grads were set to None",
        "PyTorch-115607", ("Optimizer.step", "PlannedSGD"), "EventContain",
        cause_class="optimizer step without gradients",
    ),
    BugCase(
        "moe_inconsistent_collective_args", "ranks pass different reduce ops to the MoE router all-reduce",
        "DeepSpeed-5794", ("all_reduce", "router"), "APIArg (consistent across ranks)", launch=TORCHRUN_2,
        cause_class="inconsistent collective arguments across ranks",
    ),
    BugCase(
        "eval_mode_left_on", "model left in eval mode after validation",
        "PyTorch-forum (model.train() forgotten)", ("training", "stage 'eval'"), "APIArg (training flag)",
        cause_class="training in evaluation mode",
    ),
    BugCase(
        "tied_weights_untied", "tied embedding and LM head untied by a checkpoint restore with assign=True",
        "Transformers (tied weights lost on resize/load)", ("head.weight", "embed.weight"), "Consistent",
        cause_class="weight tying broken",
    ),
)


#: Reproductions of mistakes reported in public issue trackers and forums, one program
#: each, chosen to widen the set of root-cause classes. ``gap`` says, for those the shipped
#: default set misses, what invariant or recorded fact would catch them.
FIELD_BUGS: tuple[BugCase, ...] = (
    BugCase(
        "detached_backbone_features", "backbone features detached before the head; the backbone stops training",
        "queenie88/A-GCN-4", ("backbone", "detach", "grad"), "EventContain (every trainable parameter gets a gradient)",
        cause_class="computation graph cut by detach",
        gap="the step rule needs only one changed parameter; no per-parameter rule that a parameter the optimizer "
            "holds with requires_grad=True receives a gradient",
    ),
    BugCase(
        "layers_in_python_list", "new adapter kept in a plain list; never registered, never trained",
        "pytorch/pytorch-715", ("adapters", "Linear", "ModuleList"), "EventContain (modules in forward are registered)",
        cause_class="submodule not registered",
        gap="the producer snapshots only registered parameters; no rule relating the modules run inside a model's "
            "forward to its registered submodules",
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
        "gaohongkui/GlobalPointer_pytorch-7", ("Optimizer", "Adam", "state"), "APIArg (optimizer identity stable)",
        cause_class="optimizer state reset",
        gap="no rule on optimizer identity or state continuity across steps; the trace of the buggy run also "
            "counts only 4 of its 6 iterations",
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
        "StackOverflow-61854165", ("load_state_dict", "module."), "APIArg (load_state_dict changes the parameters)",
        cause_class="checkpoint silently not loaded",
        gap="load_state_dict is not intercepted; no rule that a restore replaces the weights it is given",
    ),
    BugCase(
        "loss_requires_grad_hack", "loss computed under no_grad, then loss.requires_grad = True; no parameter gets a gradient",
        "ronghuaiyang/arcface-pytorch-56", ("Optimizer.step", "requires_grad"), "EventContain (step changes parameters)",
        cause_class="graph broken, backward forced to run",
    ),
    BugCase(
        "double_softmax", "model outputs softmax probabilities into cross_entropy",
        "ariecattan/SciCo-2", ("softmax", "cross_entropy"), "APIOutput (loss input is logits)",
        cause_class="loss input convention violated",
        gap="neither softmax nor the loss functions are intercepted; no rule on what a classification loss receives",
    ),
    BugCase(
        "mse_broadcast_target", "target (N,) against prediction (N, 1); MSE broadcasts to (N, N)",
        "pytorch/pytorch-16045", ("mse_loss", "target"), "APIArg (loss input and target shapes equal)",
        cause_class="loss target broadcast",
        gap="loss functions are not intercepted; no rule that a regression loss's input and target have equal shapes",
    ),
    BugCase(
        "amp_clip_scaled_grads", "clip_grad_norm_ on GradScaler-scaled gradients (unscale_ dropped)",
        "milesial/Pytorch-UNet-468", ("clip_grad_norm_", "unscale_", "GradScaler"),
        "APISequence (unscale_ before clip when a scaler is used)",
        cause_class="AMP gradients clipped while scaled",
        gap="GradScaler methods are not intercepted; no rule 'unscale_ before clip_grad_norm_ in steps that scale "
            "the loss' (the clip's input norm, ~1e5, is not recorded either)",
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
        gap="LRScheduler.step is recorded but no shipped rule bounds how often it runs per optimizer step, and the "
            "learning rate is not a checked quantity",
    ),
    BugCase(
        "frozen_bn_stats_updated", "backbone frozen with requires_grad=False; its BatchNorm running stats keep moving",
        "pytorch/pytorch-86590 / lightly-ai/lightly-1438", ("BatchNorm", "running_mean", "backbone"),
        "TrainingFlag (modules with frozen parameters run in eval mode)",
        cause_class="frozen BatchNorm statistics still updated",
        gap="BatchNorm buffers are not compared across steps; no rule that a module whose parameters are all frozen "
            "keeps its buffers (or runs in eval mode)",
    ),
    BugCase(
        "distributed_sampler_no_set_epoch", "DistributedSampler.set_epoch not called; every epoch replays the same order",
        "pytorch/pytorch-31771", ("set_epoch", "DistributedSampler"), "APIArg (batch content differs across epochs)",
        launch=TORCHRUN_2,
        cause_class="data order not reshuffled across epochs",
        gap="the sampler's epoch and indices are not recorded; no rule that an epoch's batches differ from the "
            "previous epoch's",
    ),
)


@dataclass(frozen=True)
class HealthyProgram:
    """A healthy program with no buggy twin: it must come back clean."""

    id: str
    title: str
    source: str
    launch: str = SINGLE
    steps: int = 6

    @property
    def path(self) -> Path:
        return HERE / f"{self.id}.py"

    def command(self, python: str, *, seed: int = 0, steps: int | None = None) -> list[str]:
        launcher = [python] if self.launch == SINGLE else [
            python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        ]
        return launcher + [str(self.path), "--steps", str(steps or self.steps), "--seed", str(seed)]


#: Programs shaped the way real training code is rather than the way the producer first
#: modelled it: updates without ``torch.optim``, closures, ``Module.zero_grad``, several
#: optimizers, steps that change nothing, programs that never train, compiled DDP, and
#: evaluation helpers that re-seed. ``onset`` counts training iterations from 0 (the
#: ``--onset`` flag); with a setup window in the trace (step 0) iteration ``k`` is trace
#: step ``k + 1`` — ``onset_step`` converts.
RUN_MODEL_BUGS: tuple[BugCase, ...] = (
    BugCase(
        "manual_sgd_grad_accumulates", "hand-written SGD loop stops calling model.zero_grad(); gradients accumulate",
        "pytorch/examples word_language_model loop + StackOverflow 'why zero_grad'", ("zero_grad", "grad"),
        "APISequence (gradients cleared between iterations)",
        cause_class="gradients not cleared between iterations",
    ),
    BugCase(
        "manual_sgd_update_discarded", "hand-written update rebinds `p = p - lr * p.grad`; parameters never change",
        "PyTorch-forum (manual update does not change parameters)", ("0.weight", "0.bias", "2.weight", "2.bias"),
        "EventContain (iteration with backward changes parameters)",
        cause_class="update not applied in place",
    ),
    BugCase(
        "gan_module_zero_grad", "DCGAN-style loop drops netD.zero_grad(); D steps on accumulated and leaked gradients",
        "pytorch/examples dcgan", ("zero_grad", "optimizerD", "opt0"), "APISequence (per optimizer, Module.zero_grad clears)",
        cause_class="gradients not cleared between iterations",
    ),
    BugCase(
        "two_optimizers_one_forgotten", "decoder_optimizer.zero_grad() dropped; encoder's zero_grad hides it",
        "PyTorch seq2seq tutorial (encoder/decoder optimizers)", ("zero_grad", "opt1", "decoder"),
        "APISequence (per optimizer)",
        cause_class="gradients not cleared between iterations",
    ),
    BugCase(
        "optimizer_holds_stale_params", "model rebuilt on resume, optimizer keeps the old parameters; nothing updates",
        "PyTorch-forum (loss flat after resuming from checkpoint)", ("Optimizer.step", "0.weight", "2.weight"),
        "EventContain (optimizer step changes the model's parameters)",
        cause_class="optimizer holds the wrong parameters",
    ),
    BugCase(
        "reinit_after_load", "evaluation job re-initialises loaded weights with module.weight.data.normal_()",
        "Transformers (fine-tuned model at chance after loading; _init_weights re-run)",
        ("normal_", "param_overwrite", "embed.weight", "proj.weight", "classifier.weight"),
        "APIAbsent-in-stage (parameter overwritten after load_state_dict)", onset=0, in_setup=True,
        cause_class="trained weights re-initialised",
    ),
    BugCase(
        "dataloader_only_same_rng", "DataLoader-only job: dataset-owned numpy RNG not reseeded per worker",
        "StackOverflow-67180955", ("worker_init", "numpy", "rng"), "APIArg (distinct across workers)",
        onset=0, in_setup=True,
        cause_class="DataLoader worker RNG not reseeded",
    ),
    BugCase(
        "compiled_ddp_drift", "torch.compile'd DDP model: every micro-batch under no_sync(); replicas drift",
        "PyTorch-forum (no_sync gradient accumulation never syncs)", ("0.weight", "0.bias", "2.weight", "2.bias"),
        "Consistent (parameters equal across ranks)", launch=TORCHRUN_2,
        cause_class="data-parallel gradient sync bypassed",
    ),
)

RUN_MODEL_HEALTHY: tuple[HealthyProgram, ...] = (
    HealthyProgram("lbfgs_closure", "full-batch L-BFGS; every forward/backward inside step(closure)",
                   "pytorch/examples time_sequence_prediction"),
    HealthyProgram("reseed_before_eval", "test() re-seeds with torch.manual_seed before model.eval()",
                   "pytorch/examples-style test(model) helpers"),
)

#: Every reproduction, each a buggy program with its healthy twin.
ALL_BUGS: tuple[BugCase, ...] = BUGS + RUN_MODEL_BUGS + FIELD_BUGS

BY_ID = {case.id: case for case in ALL_BUGS}


def onset_step(onset: int, *, in_setup: bool, setup_window: bool) -> int:
    """The trace step at which a bug is live: 0 for a setup-window bug; otherwise its
    iteration index ``onset``, shifted by one when the trace opens with a setup window."""
    if in_setup:
        return 0
    return onset + (1 if setup_window else 0)


def as_json() -> str:
    return json.dumps([{**asdict(case), "script": case.path.name} for case in ALL_BUGS], indent=2)


if __name__ == "__main__":
    print(as_json())
