"""The healthy reference pipelines the default invariant set is inferred from.

Each is launched exactly as a user would launch it. Two-rank pipelines go through
``torch.distributed.run`` (or spawn their own ranks), so data-parallel invariants are
learned from real multi-process traces.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from harness import REPO

SINGLE, TORCHRUN_2, SELF_SPAWN = "single", "torchrun-2", "self-spawn"


@dataclass(frozen=True)
class Reference:
    id: str
    script: str
    launch: str = SINGLE
    extra: tuple[str, ...] = ()
    #: how its training loop is written (see `shipping_rules.STYLES`); empty: looked up there
    style: str = ""
    #: the public program or recipe it is modelled on (corpus pipelines)
    modelled_on: str = ""

    def command(self, *, seed: int, steps: int, python: str = sys.executable) -> list[str]:
        launcher = [python] if self.launch != TORCHRUN_2 else [
            python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        ]
        return [*launcher, str(REPO / self.script), "--steps", str(steps), "--seed", str(seed), *self.extra]


REFERENCES: tuple[Reference, ...] = (
    Reference("mlp_regression_sgd", "examples/mlp_regression_sgd.py"),
    Reference("gpt_tied_lm", "examples/gpt_tied_lm.py"),
    Reference("lstm_classifier", "examples/lstm_classifier.py", extra=("--eval-every", "2")),
    Reference("conv_autoencoder", "examples/conv_autoencoder.py"),
    Reference("gan_two_optimizers", "examples/gan_two_optimizers.py"),
    Reference("bf16_autocast", "examples/bf16_autocast.py"),
    Reference("bf16_autocast_encoder", "examples/bf16_autocast_encoder.py"),
    Reference("bf16_weights_finetune", "examples/bf16_weights_finetune.py"),
    Reference("grad_accumulation", "examples/grad_accumulation.py"),
    Reference("finetune_frozen_backbone", "examples/finetune_frozen_backbone.py"),
    Reference("dataloader_augment", "examples/dataloader_augment.py"),
    Reference("speech_augment_owned_rng", "examples/speech_augment_owned_rng.py"),
    Reference("resnet_cosine", "examples/resnet_cosine.py", extra=("--epoch-steps", "3")),
    Reference("ddp_torchrun", "examples/ddp_torchrun.py", TORCHRUN_2),
    Reference("manual_allreduce_dp", "examples/manual_allreduce_dp.py", TORCHRUN_2),
    # The producers' examples are healthy pipelines too.
    Reference("mlp", "examples/mlp.py"),
    Reference("cnn_bn_dropout", "examples/cnn_bn_dropout.py", extra=("--num-workers", "2", "--val-every", "3")),
    Reference("tiny_transformer_lm", "examples/tiny_transformer_lm.py"),
    Reference("ddp_gloo", "examples/ddp_gloo.py", TORCHRUN_2),
    Reference("spawn_ddp", "examples/spawn_ddp.py", SELF_SPAWN),
    Reference("sngan_hinge", "examples/sngan_hinge.py"),
)

#: Pipelines written after public programs and recipes, each in its authors' habits (the
#: docstring of each file names its model).  Together with the examples above they are
#: the evidence an invariant needs before it ships (`shipping_rules`).
CORPUS: tuple[Reference, ...] = (
    Reference("segmentation_owned_rng", "benchmarks/corpus/segmentation_owned_rng.py", style="segmentation",
              modelled_on="pytorch/vision references/segmentation + DataLoader worker reseeding recipe"),
    Reference("mlm_masking_owned_rng", "benchmarks/corpus/mlm_masking_owned_rng.py", style="mlm-pretraining",
              modelled_on="google-research/bert create_pretraining_data.py masking through a DataLoader"),
)

REFERENCES = REFERENCES + CORPUS
