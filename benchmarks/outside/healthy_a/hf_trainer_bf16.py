"""Healthy: Hugging Face examples/pytorch/language-modeling/run_clm.py with TrainingArguments(bf16=True, use_cpu=True):
a tiny LlamaForCausalLM built from a LlamaConfig (no download), group_texts-style fixed-length blocks with
labels = input_ids, default_data_collator, cosine schedule with warmup, weight decay, gradient clipping
(max_grad_norm), eval_strategy="steps" with eval_steps=10, and a final trainer.evaluate() with perplexity."""
import math, torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, default_data_collator, set_seed
set_seed(0)
cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(cfg)
class Blocks(Dataset):
    def __init__(self, n, seed, block_size=32):
        g = torch.Generator().manual_seed(seed)
        stream = []
        while len(stream) < n * block_size:
            start, step = torch.randint(0, 128, (2,), generator=g).tolist()
            stream += [(start + i * (step % 7 + 1)) % 128 for i in range(16)]
        self.blocks = torch.tensor(stream[: n * block_size]).view(n, block_size)
    def __len__(self): return len(self.blocks)
    def __getitem__(self, i):
        ids = self.blocks[i]; return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
args = TrainingArguments(output_dir="out_hf_trainer_bf16", bf16=True, use_cpu=True,
                         per_device_train_batch_size=8, per_device_eval_batch_size=16, max_steps=30,
                         learning_rate=2e-3, weight_decay=0.1, warmup_ratio=0.1, lr_scheduler_type="cosine",
                         max_grad_norm=1.0, eval_strategy="steps", eval_steps=10, logging_steps=10,
                         save_strategy="no", report_to=[], dataloader_num_workers=0, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=Blocks(240, 1), eval_dataset=Blocks(32, 2),
                  data_collator=default_data_collator)
trainer.train()
metrics = trainer.evaluate(); metrics["perplexity"] = math.exp(metrics["eval_loss"]); print(metrics)
