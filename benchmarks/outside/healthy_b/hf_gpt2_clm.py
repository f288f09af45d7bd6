"""Modelled on huggingface/transformers examples/pytorch/language-modeling/run_clm.py
(group_texts into block_size chunks, DataCollatorForLanguageModeling(mlm=False),
gradient_accumulation_steps, bf16, cosine schedule with warmup, eval perplexity).
GPT-2 built from a tiny GPT2Config; synthetic corpus from a small Markov chain."""
import math, numpy as np, torch

class Dataset(torch.utils.data.Dataset):
    def __init__(self, cols): self.rows = [dict(zip(cols, v)) for v in zip(*cols.values())]
    @classmethod
    def from_dict(cls, cols): return cls(cols)
    def __len__(self): return len(self.rows)
    def __getitem__(self, i): return self.rows[i]
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed
set_seed(0)
V, BLOCK = 128, 32
rng = np.random.default_rng(0)
T = rng.dirichlet(np.ones(V) * 0.05, size=V)
def corpus(n):
    x = [0]; 
    for _ in range(n): x.append(int(rng.choice(V, p=T[x[-1]])))
    return x
def group_texts(tokens):
    tot = (len(tokens) // BLOCK) * BLOCK
    blocks = [tokens[i:i+BLOCK] for i in range(0, tot, BLOCK)]
    return Dataset.from_dict({"input_ids": blocks, "labels": [b[:] for b in blocks]})
train, val = group_texts(corpus(BLOCK*192)), group_texts(corpus(BLOCK*32))
cfg = GPT2Config(vocab_size=V, n_positions=64, n_embd=64, n_layer=2, n_head=4)
model = GPT2LMHeadModel(cfg)
args = TrainingArguments(output_dir="out/hf_gpt2", per_device_train_batch_size=4,
    gradient_accumulation_steps=4, per_device_eval_batch_size=16, learning_rate=2e-3, lr_scheduler_type="cosine",
    warmup_steps=4, num_train_epochs=3, eval_strategy="steps", eval_steps=12, logging_steps=4, save_strategy="no",
    bf16=True, max_grad_norm=1.0, weight_decay=0.1, report_to=[], use_cpu=True, seed=0)
def collate(f):
    ids = torch.tensor([x["input_ids"] for x in f]); return {"input_ids": ids, "labels": ids.clone()}
trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val, data_collator=collate)
trainer.train()
m = trainer.evaluate(); print(m, "ppl", math.exp(m["eval_loss"]))
