"""Whisper-style speech recognition trained with Seq2SeqTrainer on synthetic "log-mel" utterances.

Modelled on: the Hugging Face blog post "Fine-Tune Whisper For Multilingual ASR with Transformers"
(huggingface.co/blog/fine-tune-whisper, Sanchit Gandhi): ``DataCollatorSpeechSeq2SeqWithPadding``
(pads the label ids with -100 and cuts the leading decoder-start token, because the model prepends
it again when it shifts the labels), ``compute_metrics`` with WER on generated transcripts,
``model.generation_config.forced_decoder_ids = None`` and ``Seq2SeqTrainingArguments`` with
``gradient_checkpointing=True``, mixed precision, ``eval_strategy="steps"`` and
``predict_with_generate=True``.

The model is a tiny ``WhisperForConditionalGeneration`` built from a ``WhisperConfig`` (no download);
a "word" is a fixed random spectral template lasting a few frames, an utterance is 2-5 words plus
noise, and the transcript is the word ids.

Unusual but correct: activations are recomputed in backward (gradient checkpointing, non-reentrant),
the forward runs under CPU bf16 autocast, the linear warm-up starts at lr 0 so the first optimizer
step does not move the weights, and evaluation with autoregressive generation runs in the middle of
training (every 15 of 45 steps), i.e. the model is switched to eval + generate and back mid-run.
"""
import math
import random
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

torch.set_num_threads(1)

from transformers import (Seq2SeqTrainer, Seq2SeqTrainingArguments, WhisperConfig,
                          WhisperForConditionalGeneration, set_seed)

PAD, SOT, EOT = 0, 1, 2          # pad, <|startoftranscript|>, <|endoftext|>
FIRST_WORD, N_WORDS = 3, 8       # word ids 3..10
N_MELS, N_FRAMES, FRAMES_PER_WORD = 16, 64, 10


class SyntheticSpeech(torch.utils.data.Dataset):
    """Each sample: (N_MELS, N_FRAMES) features + the token ids of its transcript."""

    def __init__(self, n, seed, templates):
        g = np.random.default_rng(seed)
        self.items = []
        for _ in range(n):
            words = g.integers(0, N_WORDS, size=g.integers(2, 6)).tolist()
            feats = np.full((N_MELS, N_FRAMES), -1.0, dtype=np.float32)  # log-mel "silence"
            start = int(g.integers(0, 4))
            for w in words:
                feats[:, start:start + FRAMES_PER_WORD] = templates[w]
                start += FRAMES_PER_WORD + int(g.integers(0, 2))
            feats += 0.3 * g.standard_normal(feats.shape).astype(np.float32)
            # the "tokenizer" output starts with <|startoftranscript|> and ends with <|endoftext|>
            labels = [SOT] + [FIRST_WORD + w for w in words] + [EOT]
            self.items.append({"input_features": torch.from_numpy(feats), "labels": labels})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


@dataclass
class DataCollatorSpeechSeq2SeqWithPadding:
    decoder_start_token_id: int

    def __call__(self, features):
        input_features = torch.stack([f["input_features"] for f in features])
        max_len = max(len(f["labels"]) for f in features)
        labels = torch.full((len(features), max_len), -100, dtype=torch.long)
        for i, f in enumerate(features):
            labels[i, :len(f["labels"])] = torch.tensor(f["labels"])
        # if the start token was added by the tokenizer, cut it: the model prepends it when shifting
        if (labels[:, 0] == self.decoder_start_token_id).all().item():
            labels = labels[:, 1:]
        return {"input_features": input_features, "labels": labels}


def edit_distance(a, b):
    d = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        prev, d[0] = d[0], i
        for j in range(1, len(b) + 1):
            cur = d[j]
            d[j] = min(d[j] + 1, d[j - 1] + 1, prev + (a[i - 1] != b[j - 1]))
            prev = cur
    return d[len(b)]


def strip_special(ids):
    out = []
    for t in ids:
        t = int(t)
        if t == EOT:
            break
        if t >= FIRST_WORD:
            out.append(t)
    return out


def compute_metrics(pred):
    pred_ids, label_ids = pred.predictions, pred.label_ids
    label_ids = np.where(label_ids == -100, PAD, label_ids)
    errors, words = 0, 0
    for p, l in zip(pred_ids, label_ids):
        ref = strip_special(l)
        errors += edit_distance(strip_special(p), ref)
        words += len(ref)
    return {"wer": 100.0 * errors / max(words, 1)}


def main():
    set_seed(0)
    templates = np.random.default_rng(123).normal(0.0, 1.5, size=(N_WORDS, N_MELS, 1)).astype(np.float32)
    templates = np.repeat(templates, FRAMES_PER_WORD, axis=2)
    train_ds = SyntheticSpeech(720, seed=1, templates=templates)
    eval_ds = SyntheticSpeech(64, seed=2, templates=templates)

    config = WhisperConfig(
        vocab_size=FIRST_WORD + N_WORDS + 1, num_mel_bins=N_MELS, d_model=64,
        encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=N_FRAMES // 2,
        max_target_positions=16, pad_token_id=PAD, bos_token_id=SOT, eos_token_id=EOT,
        decoder_start_token_id=SOT, suppress_tokens=None, begin_suppress_tokens=None,
        dropout=0.0, use_cache=False)
    model = WhisperForConditionalGeneration(config)
    model.generation_config.forced_decoder_ids = None
    model.generation_config.max_length = 10

    with tempfile.TemporaryDirectory() as out_dir:
        args = Seq2SeqTrainingArguments(
            output_dir=out_dir,
            per_device_train_batch_size=16,
            per_device_eval_batch_size=32,
            learning_rate=4e-3,
            warmup_steps=8,
            max_steps=45,
            weight_decay=0.01,
            gradient_checkpointing=True,
            gradient_checkpointing_kwargs={"use_reentrant": False},
            bf16=True,
            eval_strategy="steps",
            eval_steps=15,
            predict_with_generate=True,
            generation_max_length=10,
            logging_steps=5,
            remove_unused_columns=False,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
        )
        trainer = Seq2SeqTrainer(
            model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
            data_collator=DataCollatorSpeechSeq2SeqWithPadding(config.decoder_start_token_id),
            compute_metrics=compute_metrics,
        )
        trainer.train()
        metrics = trainer.evaluate()
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()})
    history = [h for h in trainer.state.log_history if "eval_wer" in h]
    print("eval WER over training:", [round(h["eval_wer"], 1) for h in history])
    assert math.isfinite(metrics["eval_loss"])


if __name__ == "__main__":
    main()
