"""Padding-free (packed) supervised fine-tuning of a tiny Llama with the HF Trainer.

Modelled on: the Hugging Face blog post "Improving Hugging Face Training Efficiency Through
Packing with Flash Attention 2" (https://huggingface.co/blog/packing-with-FA2) and the
``DataCollatorWithFlattening`` docs: instead of padding, every batch of examples is
concatenated into ONE row of shape [1, total_tokens]; ``position_ids`` restart at 0 for each
example so attention stays inside each example, and the first label of every example is
replaced by -100 so no token is predicted across an example boundary.  Completion-only loss
(prompt tokens labelled -100) as in TRL's SFT recipes.  The model is a ``LlamaConfig`` model
with ``use_cache=False`` and SDPA attention (transformers derives the block-diagonal causal mask
from the restarting ``position_ids``; the script checks this equals unpacked forwards).

Unusual (but intended) things about the loop:
* per_device_train_batch_size counts *examples*; every optimizer step sees a different number
  of tokens (no padding at all), and the loss is a mean over a varying number of answer tokens;
* gradient checkpointing (non-reentrant) + bf16 autocast on CPU, warm-up from lr 0, cosine decay;
* evaluation every 15 steps (mid-epoch) and a final greedy-decoding exact-match check with
  ``generate`` (which turns the KV cache back on for inference only).
"""
import os
import random
import tempfile

import torch
from transformers import (DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM, Trainer,
                          TrainingArguments, set_seed)

torch.set_num_threads(1)
set_seed(0)

# Character-level vocabulary: digits, a few task words and specials.
SPECIALS = ["<pad>", "<s>", "</s>"]
WORDS = ["sort", "reverse", "copy", ":", "="]
VOCAB = SPECIALS + WORDS + [str(d) for d in range(10)]
STOI = {t: i for i, t in enumerate(VOCAB)}
BOS, EOS = STOI["<s>"], STOI["</s>"]


def make_example(rng):
    task = rng.choice(["sort", "reverse", "copy"])
    digits = [str(rng.randint(0, 9)) for _ in range(rng.randint(2, 4))]
    answer = {"sort": sorted(digits), "reverse": digits[::-1], "copy": digits}[task]
    prompt = [BOS, STOI[task], STOI[":"]] + [STOI[d] for d in digits] + [STOI["="]]
    completion = [STOI[d] for d in answer] + [EOS]
    return {"input_ids": prompt + completion,
            "labels": [-100] * len(prompt) + completion,   # completion-only loss
            "prompt_len": len(prompt)}


class SFTDataset(torch.utils.data.Dataset):
    """Pre-tokenised examples; the collator only sees input_ids and labels."""

    def __init__(self, n, seed):
        rng = random.Random(seed)
        self.rows = [make_example(rng) for _ in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        r = self.rows[i]
        return {"input_ids": r["input_ids"], "labels": r["labels"]}


def check_packing_matches_unpacked(model, collator, rows):
    """Sanity check: a packed forward equals separate forwards, example by example."""
    model.eval()
    batch = collator([{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows])
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
        start, err = 0, 0.0
        for r in rows:
            n = len(r["input_ids"])
            single = model(input_ids=torch.tensor([r["input_ids"]])).logits[0]
            err = max(err, (packed[start:start + n] - single).abs().max().item())
            start += n
    print(f"packed-vs-unpacked max |dlogits| = {err:.2e}")
    assert err < 1e-4


@torch.no_grad()
def exact_match(model, rows):
    model.eval()
    hits, tok_hits, tok_total = 0, 0, 0
    for r in rows:
        prompt = torch.tensor([r["input_ids"][: r["prompt_len"]]])
        target = r["input_ids"][r["prompt_len"]:]
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=len(target),
                             do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=EOS)
        pred = out[0, prompt.shape[1]:].tolist()
        hits += pred == target
        tok_hits += sum(p == t for p, t in zip(pred, target))
        tok_total += len(target)
    return hits / len(rows), tok_hits / tok_total


def main():
    train_ds, eval_ds = SFTDataset(1200, seed=0), SFTDataset(96, seed=1)
    config = LlamaConfig(vocab_size=len(VOCAB), hidden_size=64, intermediate_size=176,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, bos_token_id=BOS, eos_token_id=EOS,
                         pad_token_id=0, use_cache=False, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    collator = DataCollatorWithFlattening(return_position_ids=True, separator_id=-100)
    check_packing_matches_unpacked(model, collator, train_ds.rows[:4])

    sample = collator([train_ds[i] for i in range(3)])
    print("packed row shape", tuple(sample["input_ids"].shape),
          "position_ids", sample["position_ids"][0].tolist())

    tmp = tempfile.mkdtemp()
    args = TrainingArguments(
        output_dir=os.path.join(tmp, "sft"), per_device_train_batch_size=24,
        per_device_eval_batch_size=32, learning_rate=1e-2, warmup_ratio=0.1,
        lr_scheduler_type="cosine", weight_decay=0.0, max_steps=60, logging_steps=5,
        eval_strategy="steps", eval_steps=15, bf16=True, gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False}, max_grad_norm=1.0,
        remove_unused_columns=False, save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, data_collator=collator,
                      train_dataset=train_ds, eval_dataset=eval_ds)
    trainer.train()
    print("final eval", trainer.evaluate())
    em, tok_acc = exact_match(model, eval_ds.rows[:32])
    print(f"greedy decoding on 32 held-out prompts: exact match {em:.3f}, answer-token accuracy {tok_acc:.3f}")


if __name__ == "__main__":
    main()
