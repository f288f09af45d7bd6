"""The silent-bug benchmark's registry: one record per reproduction.

The registry is data, not logic: ``run.py`` and the tests read it to know how to launch
each reproduction, where its bug starts, which API or variable is the root cause (to
judge whether the top violation points at it) and which invariant relation is expected
to catch it. ``python registry.py`` prints it as JSON for tools outside Python.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from bug_cases import TORCHRUN_2, BugCase, HealthyProgram, onset_step
from field_bugs import FIELD_BUGS

__all__ = ["ALL_BUGS", "BUGS", "BY_ID", "FIELD_BUGS", "RUN_MODEL_BUGS", "RUN_MODEL_HEALTHY", "BugCase", "onset_step"]


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


def as_json() -> str:
    return json.dumps([{**asdict(case), "script": case.path.name} for case in ALL_BUGS], indent=2)


if __name__ == "__main__":
    print(as_json())
