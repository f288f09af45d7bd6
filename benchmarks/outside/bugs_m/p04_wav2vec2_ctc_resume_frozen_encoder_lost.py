"""CTC fine-tuning of a small Wav2Vec2 on synthetic "tone-spelled" utterances, with a frozen conv
feature encoder, a checkpoint through ``save_pretrained`` and a resume through ``from_pretrained``.

Modelled on: huggingface/transformers#11294 "serious bug with trainer.py when restarting the training
from a checkpoint" (https://github.com/huggingface/transformers/issues/11294): parameters frozen with
``requires_grad = False`` are saved, and the model is re-created with ``from_pretrained`` when training
resumes.  The ``requires_grad`` flags are not part of a checkpoint, so after the resume the frozen
parameters train again, with no error and no warning.  Freezing that is applied only when a run starts
fresh is also reported "not resume-safe" in mosaicml/composer#1002 ("Layer freezing does not support
resuming from training").  The loop follows transformers'
``examples/pytorch/speech-recognition/run_speech_recognition_ctc.py``, which calls
``model.freeze_feature_encoder()`` on the model it builds.

Unusual about the loop: a plain PyTorch loop with ``AdamW(model.parameters())``, so the frozen encoder is
in the optimizer but never gets a gradient.  At step 12 the job is preempted: the model is saved with
``save_pretrained`` and the optimizer and scheduler with ``torch.save``.  The resume branch rebuilds the
model with ``Wav2Vec2ForCTC.from_pretrained`` and reloads the optimizer state.  ``--healthy`` calls
``freeze_feature_encoder()`` again after the reload.
"""
import math
import os
import sys
import tempfile

import torch
from transformers import Wav2Vec2Config, Wav2Vec2ForCTC
from transformers.utils import logging as hf_logging

torch.set_num_threads(1)
hf_logging.set_verbosity_error()
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)

VOCAB = ["<pad>", "a", "b", "c", "d", "e", "f", "g", "h", "|"]
SR, SAMPLES = 8000, 4000
FREQ = {c: 300.0 + 180.0 * k for k, c in enumerate("abcdefgh")}


def synth_utterance(gen):
    n_chars = int(torch.randint(3, 7, (1,), generator=gen))
    chars = [VOCAB[int(i)] for i in torch.randint(1, 9, (n_chars,), generator=gen)]
    wav, t = torch.zeros(SAMPLES), torch.arange(SAMPLES) / SR
    seg = SAMPLES // (n_chars + 1)
    for k, c in enumerate(chars):
        s = int(seg * (k + 0.5) + torch.randint(-40, 40, (1,), generator=gen))
        e = s + int(seg * 0.7)
        env = torch.hann_window(e - s)
        wav[s:e] += env * torch.sin(2 * math.pi * FREQ[c] * t[s:e])
    wav += 0.05 * torch.randn(SAMPLES, generator=gen)
    return (wav - wav.mean()) / (wav.std() + 1e-7), [VOCAB.index(c) for c in chars]


def collate(samples):
    wavs = torch.stack([w for w, _ in samples])
    max_len = max(len(l) for _, l in samples)
    labels = torch.full((len(samples), max_len), -100, dtype=torch.long)
    for i, (_, l) in enumerate(samples):
        labels[i, :len(l)] = torch.tensor(l)
    return {"input_values": wavs, "labels": labels}


def batches(seed):
    gen = torch.Generator().manual_seed(seed)
    while True:
        yield collate([synth_utterance(gen) for _ in range(6)])


config = Wav2Vec2Config(
    vocab_size=len(VOCAB), pad_token_id=0, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
    intermediate_size=128, conv_dim=(32, 32, 32), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2),
    num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, feat_extract_norm="group",
    mask_time_prob=0.0, layerdrop=0.0, ctc_loss_reduction="mean", ctc_zero_infinity=True,
    hidden_dropout=0.1, activation_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0)

TOTAL, WARMUP, PREEMPT_AT, LR = 32, 4, 12, 5e-4


def lr_lambda(step):
    return (step + 1) / WARMUP if step < WARMUP else max(0.0, (TOTAL - step) / (TOTAL - WARMUP))


def build(resume_dir=None):
    if resume_dir is None:
        model = Wav2Vec2ForCTC(config)
        model.freeze_feature_encoder()  # as run_speech_recognition_ctc.py does
    else:
        model = Wav2Vec2ForCTC.from_pretrained(resume_dir)
        if HEALTHY:
            model.freeze_feature_encoder()  # requires_grad flags do not survive a checkpoint
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    return model, optimizer, scheduler


def train(model, optimizer, scheduler, start, stop, data):
    for step in range(start, stop):
        batch = next(data)
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % 5 == 0 or step == stop - 1:
            print(f"step {step:3d}  ctc loss {loss.item():.4f}  lr {scheduler.get_last_lr()[0]:.2e}")


data = batches(seed=0)
with tempfile.TemporaryDirectory() as out_dir:
    model, optimizer, scheduler = build()
    train(model, optimizer, scheduler, 0, PREEMPT_AT, data)
    ckpt_dir = os.path.join(out_dir, f"checkpoint-{PREEMPT_AT}")
    model.save_pretrained(ckpt_dir)
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "step": PREEMPT_AT},
               os.path.join(ckpt_dir, "training_state.pt"))
    del model, optimizer, scheduler

    # ---------------------------------------------------------------- relaunch with --resume_from_checkpoint
    model, optimizer, scheduler = build(resume_dir=ckpt_dir)
    state = torch.load(os.path.join(ckpt_dir, "training_state.pt"), weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    fe_before = {n: p.detach().clone() for n, p in model.wav2vec2.feature_extractor.named_parameters()}
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if not HEALTHY:
        print(f"ONSET step {state['step']}")
    train(model, optimizer, scheduler, state["step"], TOTAL, data)

fe_change = max((p.detach() - fe_before[n]).abs().max().item()
                for n, p in model.wav2vec2.feature_extractor.named_parameters())
print(f"EVIDENCE conv feature-encoder max abs weight change after resume {fe_change:.6f}; "
      f"trainable parameters after resume {n_trainable} of {sum(p.numel() for p in model.parameters())}")
