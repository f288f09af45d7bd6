"""Hand-written LoRA on GPT-2's fused attention projection, trained with the HF Trainer and
gradient checkpointing (use_reentrant=False), then merged back into the base weights.

Modelled on microsoft/LoRA (loralib's MergedLinear applied to GPT-2's c_attn, A ~ Kaiming,
B = 0, scaling alpha / r, lora-only trainable parameters, merge for inference) used the way
the Hugging Face forum thread "Fine-tuning GPT-2 with a custom LoRA layer and Trainer"
does, with TrainingArguments(gradient_checkpointing=True,
gradient_checkpointing_kwargs={"use_reentrant": False}). The 'pretrained' base is a tiny
GPT-2 trained here for a few steps and reloaded with from_pretrained, since nothing is
downloaded.

Unusual loop: almost every parameter of the model has requires_grad=False (only the
rank-4 A/B pairs train), the modules of the loaded model are swapped in place for wrappers,
the transformer blocks recompute their activations in backward, and at the end B @ A is
folded into the frozen Conv1D weight and the wrappers are removed.
"""
import math
import tempfile
import warnings

import torch
import torch.nn as nn
from transformers import GPT2Config, GPT2LMHeadModel, PrinterCallback, Trainer, TrainingArguments
from transformers.pytorch_utils import Conv1D
from transformers.utils import logging as hf_logging

torch.set_num_threads(1)
hf_logging.set_verbosity_error()
warnings.filterwarnings("ignore")
VOCAB, SEQ = 64, 24


def progressions(n, stride, seed):
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    step = stride if isinstance(stride, int) else torch.randint(1, 3, (n, 1), generator=g)
    return (start + step * torch.arange(SEQ)) % VOCAB


class LMData(torch.utils.data.Dataset):
    def __init__(self, ids):
        self.ids = ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class LoRAConv1D(nn.Module):
    def __init__(self, base: Conv1D, r=4, alpha=8):
        super().__init__()
        self.base = base
        nx, nf = base.weight.shape
        self.lora_A = nn.Parameter(torch.empty(nx, r))
        self.lora_B = nn.Parameter(torch.zeros(r, nf))
        nn.init.kaiming_uniform_(self.lora_A.T, a=math.sqrt(5))
        self.scaling = alpha / r

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A @ self.lora_B) * self.scaling

    def merged(self):
        with torch.no_grad():
            self.base.weight += (self.lora_A @ self.lora_B) * self.scaling
        return self.base


def lm_loss(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, labels=ids).loss.item()


with tempfile.TemporaryDirectory() as work:
    # ---- stand-in for a pretrained checkpoint: strides 1 and 2 ----
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=4, use_cache=False)
    base = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(base.parameters(), lr=3e-3)
    pre = progressions(2048, None, 1)
    for i in range(40):
        batch = pre[i * 32 % 2048:(i * 32 % 2048) + 32]
        loss = base(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    base.save_pretrained(f"{work}/base")

    # ---- LoRA adaptation to stride-5 sequences ----
    model = GPT2LMHeadModel.from_pretrained(f"{work}/base")
    for p in model.parameters():
        p.requires_grad_(False)
    for block in model.transformer.h:
        block.attn.c_attn = LoRAConv1D(block.attn.c_attn)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    target_val = progressions(256, 5, 3)
    print(f"trainable {n_train}/{n_all}; stride-5 val loss before {lm_loss(model, target_val):.3f}")

    args = TrainingArguments(
        output_dir=f"{work}/lora", max_steps=60, per_device_train_batch_size=32, learning_rate=5e-3,
        lr_scheduler_type="cosine", warmup_steps=6, logging_steps=10, save_strategy="no", report_to=[],
        gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False},
        use_cpu=True, seed=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=LMData(progressions(1920, 5, 2)))
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    print("train loss by step:", [(h["step"], round(h["loss"], 3)) for h in trainer.state.log_history if "loss" in h])
    after = lm_loss(model, target_val)
    print(f"stride-5 val loss after LoRA {after:.3f}")

    for block in model.transformer.h:
        block.attn.c_attn = block.attn.c_attn.merged()
    print(f"after merging into base weights {lm_loss(model, target_val):.3f} (should equal {after:.3f})")
