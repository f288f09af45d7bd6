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
    Reference("finetune_from_checkpoint", "examples/finetune_from_checkpoint.py", style="finetune"),
)

#: Pipelines written after public programs and recipes, each in its authors' habits (the
#: docstring of each file names its model).  Together with the examples above they are
#: the evidence an invariant needs before it ships (`shipping_rules`).
CORPUS: tuple[Reference, ...] = (
    Reference("segmentation_owned_rng", "benchmarks/corpus/segmentation_owned_rng.py", style="segmentation",
              modelled_on="pytorch/vision references/segmentation + DataLoader worker reseeding recipe"),
    Reference("mlm_masking_owned_rng", "benchmarks/corpus/mlm_masking_owned_rng.py", style="mlm-pretraining",
              modelled_on="google-research/bert create_pretraining_data.py masking through a DataLoader"),
    Reference("dcgan_examples", "benchmarks/corpus/dcgan_examples.py", style="gan",
              modelled_on="pytorch/examples dcgan"),
    Reference("wgan_gp_pytorch_gan", "benchmarks/corpus/wgan_gp_pytorch_gan.py", style="gan",
              modelled_on="eriklindernoren/PyTorch-GAN wgan_gp"),
    Reference("pix2pix_cyclegan_repo", "benchmarks/corpus/pix2pix_cyclegan_repo.py", style="gan",
              modelled_on="junyanz/pytorch-CycleGAN-and-pix2pix (pix2pix)"),
    Reference("lightning_gan_manual", "benchmarks/corpus/lightning_gan_manual.py", style="lightning",
              modelled_on="Lightning basic GAN tutorial (manual optimization)"),
    Reference("vae_examples", "benchmarks/corpus/vae_examples.py", style="vae",
              modelled_on="pytorch/examples vae"),
    Reference("siamese_examples", "benchmarks/corpus/siamese_examples.py", style="metric-learning",
              modelled_on="pytorch/examples siamese_network"),
    Reference("simclr_contrastive", "benchmarks/corpus/simclr_contrastive.py", style="self-supervised",
              modelled_on="sthalles/SimCLR"),
    Reference("mae_pretrain", "benchmarks/corpus/mae_pretrain.py", style="self-supervised",
              modelled_on="facebookresearch/mae main_pretrain"),
    Reference("mnist_examples", "benchmarks/corpus/mnist_examples.py", style="cnn",
              modelled_on="pytorch/examples mnist"),
    Reference("cifar_resnet_amp", "benchmarks/corpus/cifar_resnet_amp.py", style="mixed-precision",
              modelled_on="kuangliu/pytorch-cifar + torch.amp recipe"),
    Reference("ema_timm_style", "benchmarks/corpus/ema_timm_style.py", style="timm-ema",
              modelled_on="timm train.py with ModelEmaV3"),
    Reference("super_resolution_examples", "benchmarks/corpus/super_resolution_examples.py", style="image-to-image",
              modelled_on="pytorch/examples super_resolution"),
    Reference("fast_neural_style_examples", "benchmarks/corpus/fast_neural_style_examples.py", style="image-to-image",
              modelled_on="pytorch/examples fast_neural_style"),
    Reference("unet_segmentation", "benchmarks/corpus/unet_segmentation.py", style="segmentation",
              modelled_on="milesial/Pytorch-UNet"),
    Reference("ddpm_accelerate", "benchmarks/corpus/ddpm_accelerate.py", style="accelerate",
              modelled_on="lucidrains/denoising-diffusion-pytorch through Accelerate"),
    Reference("word_lm_lstm_manual_sgd", "benchmarks/corpus/word_lm_lstm_manual_sgd.py", style="manual-sgd", extra=("--tied",),
              modelled_on="pytorch/examples word_language_model (LSTM)"),
    Reference("char_rnn_classifier", "benchmarks/corpus/char_rnn_classifier.py", style="manual-sgd",
              modelled_on="PyTorch tutorial char_rnn_classification"),
    Reference("word_lm_transformer", "benchmarks/corpus/word_lm_transformer.py", style="transformer-lm",
              modelled_on="pytorch/examples word_language_model (Transformer)"),
    Reference("nanogpt_accum_bf16", "benchmarks/corpus/nanogpt_accum_bf16.py", style="nanogpt",
              modelled_on="karpathy/nanoGPT train.py"),
    # Activation checkpointing, recomputing blocks with dropout in the backward, three ways:
    # a block-level checkpoint written by hand, transformers' non-reentrant option in a
    # native loop, and HF Trainer's reentrant default.
    Reference("nanogpt_checkpoint_blocks", "benchmarks/corpus/nanogpt_accum_bf16.py", style="nanogpt",
              extra=("--checkpoint_blocks",), modelled_on="karpathy/nanoGPT train.py, blocks checkpointed"),
    Reference("hf_manual_loop_gpt2_checkpointing", "benchmarks/corpus/hf_manual_loop_gpt2.py", style="hf-native-loop",
              extra=("--gradient-checkpointing",),
              modelled_on="transformers run_clm_no_trainer.py --gradient_checkpointing"),
    Reference("hf_trainer_bert_cls_checkpointing", "benchmarks/corpus/hf_trainer_bert_cls.py", style="hf-trainer",
              extra=("--gradient-checkpointing",), modelled_on="transformers run_glue.py --gradient_checkpointing"),
    Reference("word_lm_transformer_checkpointing", "benchmarks/corpus/word_lm_transformer.py", style="transformer-lm",
              extra=("--checkpoint-encoder",),
              modelled_on="pytorch/examples word_language_model (Transformer), encoder checkpointed"),
    Reference("lightning_cnn_checkpoint_head", "benchmarks/corpus/lightning_cnn_classifier.py", style="lightning",
              extra=("--checkpoint-head",),
              modelled_on="Lightning image classifier, head checkpointed"),
    Reference("time_sequence_lbfgs", "benchmarks/corpus/time_sequence_lbfgs.py", style="lbfgs",
              modelled_on="pytorch/examples time_sequence_prediction"),
    Reference("pinn_adam_lbfgs", "benchmarks/corpus/pinn_adam_lbfgs.py", style="scientific-ml",
              modelled_on="maziarraissi/PINNs (Burgers), Adam then L-BFGS as usually ported to PyTorch"),
    Reference("neural_style_lbfgs", "benchmarks/corpus/neural_style_lbfgs.py", style="image-optimization",
              modelled_on="PyTorch tutorial 'Neural Transfer Using PyTorch'"),
    Reference("gcn_kipf", "benchmarks/corpus/gcn_kipf.py", style="gnn",
              modelled_on="tkipf/pygcn"),
    Reference("gat_pygat", "benchmarks/corpus/gat_pygat.py", style="gnn",
              modelled_on="Diego999/pyGAT"),
    Reference("graphsage_minibatch", "benchmarks/corpus/graphsage_minibatch.py", style="gnn",
              modelled_on="williamleif/graphsage-simple"),
    Reference("actor_critic_examples", "benchmarks/corpus/actor_critic_examples.py", style="rl",
              modelled_on="pytorch/examples reinforcement_learning actor_critic"),
    Reference("reinforce_examples", "benchmarks/corpus/reinforce_examples.py", style="rl",
              modelled_on="pytorch/examples reinforcement_learning reinforce"),
    Reference("dqn_soft_target", "benchmarks/corpus/dqn_soft_target.py", style="rl",
              modelled_on="PyTorch tutorial reinforcement_q_learning"),
    Reference("ppo_cleanrl", "benchmarks/corpus/ppo_cleanrl.py", style="rl",
              modelled_on="vwxyzjn/cleanrl ppo.py"),
    Reference("seq2seq_attention_tutorial", "benchmarks/corpus/seq2seq_attention_tutorial.py", style="seq2seq",
              modelled_on="PyTorch tutorial seq2seq_translation"),
    Reference("sagan_hinge", "benchmarks/corpus/sagan_hinge.py", style="gan",
              modelled_on="heykeetae/Self-Attention-GAN"),
    Reference("sngp_classifier", "benchmarks/corpus/sngp_classifier.py", style="uncertainty",
              modelled_on="google/uncertainty-baselines SNGP recipe (PyTorch ports)"),
    Reference("sac_spectral_critic", "benchmarks/corpus/sac_spectral_critic.py", style="rl",
              modelled_on="pranz24/pytorch-soft-actor-critic + spectral-normalised critics (Bjorck et al.)"),
    Reference("hf_trainer_bert_cls", "benchmarks/corpus/hf_trainer_bert_cls.py", style="hf-trainer",
              modelled_on="transformers examples/pytorch/text-classification/run_glue.py"),
    Reference("hf_manual_loop_gpt2", "benchmarks/corpus/hf_manual_loop_gpt2.py", style="hf-native-loop",
              modelled_on="transformers 'Train in native PyTorch' + run_clm_no_trainer.py"),
    Reference("lightning_cnn_classifier", "benchmarks/corpus/lightning_cnn_classifier.py", style="lightning",
              modelled_on="Lightning docs LightningModule/DataModule + cifar10-baseline tutorial"),
    Reference("lightning_manual_optimization_gan", "benchmarks/corpus/lightning_manual_optimization_gan.py",
              style="lightning", modelled_on="Lightning 'Manual Optimization' docs + basic-gan tutorial"),
    Reference("accelerate_nlp_example", "benchmarks/corpus/accelerate_nlp_example.py", style="accelerate",
              modelled_on="huggingface/accelerate examples/nlp_example.py + gradient_accumulation.py"),
    Reference("ddp_imagenet_spawn", "benchmarks/corpus/ddp_imagenet_spawn.py", SELF_SPAWN, style="ddp-spawn",
              modelled_on="pytorch/examples imagenet/main.py --multiprocessing-distributed"),
    Reference("ddp_torchrun_lora_finetune", "benchmarks/corpus/ddp_torchrun_lora_finetune.py", TORCHRUN_2,
              style="ddp-torchrun", modelled_on="microsoft/LoRA loralib + torchtune lora_finetune_distributed"),
    Reference("distillation_teacher_student", "benchmarks/corpus/distillation_teacher_student.py",
              style="distillation", modelled_on="pytorch/tutorials knowledge_distillation_tutorial"),
    Reference("compiled_mlp_lm", "benchmarks/corpus/compiled_mlp_lm.py", style="torch-compile",
              modelled_on="karpathy/nanoGPT train.py compile path + makemore MLP"),
    Reference("hf_trainer_bert_cls_ddp", "benchmarks/corpus/hf_trainer_bert_cls.py", TORCHRUN_2, style="hf-trainer",
              modelled_on="run_glue.py launched with torchrun (Trainer's own DDP)"),
    # Data-parallel runs under bf16 autocast: without them, every cross-rank rule is
    # learned only outside autocast and is never applied under it.
    Reference("hf_trainer_bert_cls_ddp_bf16", "benchmarks/corpus/hf_trainer_bert_cls.py", TORCHRUN_2,
              style="hf-trainer", extra=("--bf16",), modelled_on="run_glue.py --bf16 launched with torchrun"),
    Reference("lightning_cnn_classifier_ddp_bf16", "benchmarks/corpus/lightning_cnn_classifier.py",
              extra=("--devices", "2", "--train-samples", "128", "--precision", "bf16-mixed"), style="lightning",
              modelled_on="Lightning cifar10-baseline with devices=2, strategy='ddp', precision='bf16-mixed'"),
    Reference("lightning_cnn_classifier_ddp", "benchmarks/corpus/lightning_cnn_classifier.py",
              extra=("--devices", "2", "--train-samples", "128"),
              style="lightning", modelled_on="Lightning cifar10-baseline with devices=2, strategy='ddp' (two short epochs)"),
    Reference("bilstm_crf_tagger", "benchmarks/corpus/bilstm_crf_tagger.py", style="rnn",
              modelled_on="PyTorch tutorial Bi-LSTM CRF"),
    Reference("pointnet_owned_rng", "benchmarks/corpus/pointnet_owned_rng.py", style="pointcloud",
              modelled_on="fxia22/pointnet.pytorch train_classification.py + NumPy SeedSequence per worker"),
    Reference("iresnet_flow_spectral", "benchmarks/corpus/iresnet_flow_spectral.py", style="normalizing-flow",
              modelled_on="jhjacobsen/invertible-resnet + rtqichen/residual-flows toy 2-D densities"),
    Reference("horovod_style_mnist", "benchmarks/corpus/horovod_style_mnist.py", TORCHRUN_2, style="horovod-style",
              modelled_on="horovod/examples/pytorch/pytorch_mnist.py (on torch.distributed gloo)"),
    # Weight averages (EMAs, momentum targets), each kept the way a different library keeps it.
    Reference("lightning_ema_weight_averaging", "benchmarks/corpus/lightning_ema_weight_averaging.py",
              style="lightning", modelled_on="Lightning docs weight averaging (EMAWeightAveraging) + torchtext "
              "text classification tutorial"),
    Reference("accelerate_averaged_model_ema", "benchmarks/corpus/accelerate_averaged_model_ema.py",
              style="accelerate", modelled_on="torch.optim.swa_utils EMA recipe inside accelerate "
              "gradient_accumulation.py"),
    Reference("byol_momentum_target", "benchmarks/corpus/byol_momentum_target.py", style="self-supervised",
              modelled_on="lucidrains/byol-pytorch"),
    Reference("stylegan_g_ema", "benchmarks/corpus/stylegan_g_ema.py", style="gan",
              modelled_on="NVlabs/stylegan2-ada-pytorch training_loop.py (G_ema)"),
    Reference("hf_trainer_ema_callback", "benchmarks/corpus/hf_trainer_ema_callback.py", style="hf-trainer",
              modelled_on="transformers TrainerCallback docs + torch.optim.swa_utils EMA recipe"),
    # Jobs preempted and resumed from a checkpoint twice, each the way its library resumes.
    Reference("imagenet_style_resume", "benchmarks/corpus/imagenet_style_resume.py", style="checkpoint-resume",
              modelled_on="pytorch/examples imagenet/main.py --resume"),
    Reference("accelerate_checkpoint_resume", "benchmarks/corpus/accelerate_checkpoint_resume.py",
              style="accelerate", modelled_on="huggingface/accelerate examples/by_feature/checkpointing.py"),
    Reference("hf_trainer_resume_from_checkpoint", "benchmarks/corpus/hf_trainer_resume_from_checkpoint.py",
              style="hf-trainer", modelled_on="transformers Trainer.train(resume_from_checkpoint=...) docs"),
    Reference("lightning_ckpt_path_resume", "benchmarks/corpus/lightning_ckpt_path_resume.py", style="lightning",
              modelled_on="Lightning docs 'Saving and loading checkpoints', fit(ckpt_path=...)"),
)

REFERENCES = REFERENCES + CORPUS
