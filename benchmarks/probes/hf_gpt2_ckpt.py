"""Healthy probe: Hugging Face run_clm.py-style GPT-2 training with gradient_checkpointing=True (reentrant activation checkpointing)."""
import tempfile
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
torch.manual_seed(0)
cfg = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=4)
model = GPT2LMHeadModel(cfg)
class DS(torch.utils.data.Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, 128, (16,), generator=g)
        return {"input_ids": x, "labels": x}
args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=12, learning_rate=5e-4,
    gradient_checkpointing=True, logging_steps=4, report_to=[], save_strategy="no", use_cpu=True, optim="adamw_torch", lr_scheduler_type="linear", warmup_ratio=0.2)
Trainer(model=model, args=args, train_dataset=DS()).train()
