"""Modelled on huggingface/transformers examples/legacy/seq2seq/finetune_trainer.py
(Seq2SeqTrainer with --freeze_embeds, --label_smoothing, --predict_with_generate) and the
resume_from_checkpoint flow of examples/pytorch/summarization/run_summarization.py.

Exercises: a tiny T5 (T5Config, random init) whose shared token embedding -- tied to the LM
head -- and the encoder/decoder embed_tokens are frozen (requires_grad=False, so the Trainer
leaves them out of the optimizer); label smoothing; generation-based evaluation with a
compute_metrics that decodes predictions; training interrupted at step 16 (checkpoint with
optimizer + scheduler + RNG state) and continued by a fresh Seq2SeqTrainer via
resume_from_checkpoint=True up to max_steps=32. Synthetic "summaries": a two-token headline
naming the topic most of the source tokens are drawn from.
"""
import shutil
import numpy as np
import torch
from transformers import (T5Config, T5ForConditionalGeneration, Seq2SeqTrainer, Seq2SeqTrainingArguments,
                          set_seed)

torch.set_num_threads(1)
set_seed(42)
PAD, EOS, V = 0, 1, 64
rng = np.random.default_rng(0)


class Seq2SeqDataset(torch.utils.data.Dataset):
    """source: a 'document' whose words come mostly from one of 4 topics; target: that topic's
    two-word headline."""
    def __init__(self, n):
        self.examples = []
        for _ in range(n):
            topic = int(rng.integers(0, 4))
            lo = 16 + 12 * topic
            ln = int(rng.integers(10, 20))
            src = np.where(rng.random(ln) < 0.7, rng.integers(lo, lo + 12, size=ln),
                           rng.integers(16, V, size=ln)).tolist()
            tgt = [4 + 2 * topic, 5 + 2 * topic]
            self.examples.append({"input_ids": src + [EOS], "labels": tgt + [EOS]})

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]


def collate(batch):
    ml = max(len(b["input_ids"]) for b in batch)
    tl = max(len(b["labels"]) for b in batch)
    input_ids = torch.full((len(batch), ml), PAD)
    labels = torch.full((len(batch), tl), -100)
    for i, b in enumerate(batch):
        input_ids[i, :len(b["input_ids"])] = torch.tensor(b["input_ids"])
        labels[i, :len(b["labels"])] = torch.tensor(b["labels"])
    # like DataCollatorForSeq2Seq(model=...): needed because label smoothing pops "labels" before forward
    decoder_input_ids = torch.cat([torch.full((len(batch), 1), config.decoder_start_token_id), labels[:, :-1]], 1)
    decoder_input_ids = decoder_input_ids.masked_fill(decoder_input_ids == -100, PAD)
    return {"input_ids": input_ids, "attention_mask": (input_ids != PAD).long(), "labels": labels,
            "decoder_input_ids": decoder_input_ids}


def freeze_params(model):
    for par in model.parameters():
        par.requires_grad = False


def freeze_embeds(model):
    """Freeze token embeddings and positional embeddings for bart, just token embeddings for t5."""
    freeze_params(model.shared)
    for d in [model.encoder, model.decoder]:
        freeze_params(d.embed_tokens)


def assert_all_frozen(module):
    assert not any(p.requires_grad for p in module.parameters())


def compute_metrics(pred):
    preds, labels = pred.predictions, pred.label_ids
    labels = np.where(labels == -100, PAD, labels)
    exact, lens = [], []
    for p, l in zip(preds, labels):
        p = [t for t in p.tolist() if t not in (PAD,)]
        l = [t for t in l.tolist() if t not in (PAD,)]
        p = p[:p.index(EOS)] if EOS in p else p
        l = l[:l.index(EOS)] if EOS in l else l
        exact.append(float(p == l))
        lens.append(len(p))
    return {"exact_match": float(np.mean(exact)), "gen_len": float(np.mean(lens))}


train_ds, eval_ds = Seq2SeqDataset(256), Seq2SeqDataset(32)
config = T5Config(vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                  relative_attention_num_buckets=8, dropout_rate=0.1, decoder_start_token_id=PAD,
                  pad_token_id=PAD, eos_token_id=EOS)


def make_trainer(max_steps):
    model = T5ForConditionalGeneration(config)
    freeze_embeds(model)
    assert_all_frozen(model.shared)
    args = Seq2SeqTrainingArguments(
        output_dir=OUT, max_steps=max_steps, per_device_train_batch_size=16,
        per_device_eval_batch_size=32, learning_rate=1e-2, lr_scheduler_type="linear", warmup_steps=4,
        label_smoothing_factor=0.1, weight_decay=0.0, eval_strategy="steps", eval_steps=16,
        save_strategy="steps", save_steps=16, logging_steps=8, predict_with_generate=True,
        generation_max_length=8, generation_num_beams=1, report_to=[], use_cpu=True, seed=42,
        dataloader_num_workers=0, save_total_limit=2)
    return Seq2SeqTrainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                          data_collator=collate, compute_metrics=compute_metrics)


OUT = "out/hf_t5_seq2seq_freeze_resume"
shutil.rmtree(OUT, ignore_errors=True)  # fresh experiment directory

# first job: gets pre-empted after 16 steps (the checkpoint-16 folder is what survives)
first = make_trainer(max_steps=16)
first.train()
n_trainable = sum(p.numel() for p in first.model.parameters() if p.requires_grad)
print("trainable params:", n_trainable, "of", sum(p.numel() for p in first.model.parameters()))

# second job: same command line with a longer schedule, resumes from the last checkpoint
second = make_trainer(max_steps=32)
result = second.train(resume_from_checkpoint=True)
print(result)
print(second.evaluate(max_length=8, num_beams=1, metric_key_prefix="val"))
