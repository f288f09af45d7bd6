"""Hand-written LoRA (via torch.nn.utils.parametrize) plus newly added tokens on a GPT-2 built
from a config, trained with the Hugging Face Trainer in two stages.

Modelled on: cccntu/minLoRA (LoRAParametrization registered with
torch.nn.utils.parametrize.register_parametrization, merge by remove_parametrizations) and the
"add new tokens, train only their embedding rows" recipe from huggingface/peft
(`trainable_token_indices` / TrainableTokensModel), with the Trainer set-up of
transformers examples/pytorch/language-modeling/run_clm.py.

Unusual but intended:
  * stage 1 trains the whole base model; stage 2 builds a *new* Trainer (and optimizer) on the
    same model after resizing the vocabulary and wrapping attention/MLP weights in LoRA
    parametrizations, so almost every stage-1 parameter is frozen in stage 2;
  * the (tied) token-embedding matrix stays trainable, but a tensor hook multiplies its gradient
    by a row mask so that only the 4 new token rows move (weight decay is 0, so AdamW leaves the
    masked rows exactly unchanged -- the script asserts that);
  * lora_B starts at zero, so right after wrapping the model's output is unchanged;
  * evaluation happens every 10 steps (eval_strategy="steps"), mid-epoch;
  * at the end the LoRA deltas are merged into the base weights and the eval loss is rechecked.
"""
import math
import tempfile

import torch
import torch.nn as nn
import torch.nn.utils.parametrize as parametrize
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed
from transformers.pytorch_utils import Conv1D

torch.set_num_threads(1)
BASE_VOCAB, N_NEW, SEQ = 64, 4, 32


class LoRAParametrization(nn.Module):
    def __init__(self, fan_in, fan_out, fan_in_fan_out=False, rank=4, alpha=8):
        super().__init__()
        self.swap = fan_in_fan_out  # HF Conv1D stores weight as (in, out)
        self.lora_A = nn.Parameter(torch.zeros(rank, fan_in))
        self.lora_B = nn.Parameter(torch.zeros(fan_out, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scaling = alpha / rank

    def forward(self, W):
        delta = (self.lora_B @ self.lora_A) * self.scaling
        return W + (delta.T if self.swap else delta)


def add_lora(model, targets=("c_attn", "c_fc"), rank=4):
    for name, mod in model.named_modules():
        if isinstance(mod, Conv1D) and name.split(".")[-1] in targets:
            fan_in, fan_out = mod.weight.shape
            parametrize.register_parametrization(mod, "weight", LoRAParametrization(fan_in, fan_out, True, rank))


def merge_lora(model):
    for mod in model.modules():
        if parametrize.is_parametrized(mod, "weight"):
            parametrize.remove_parametrizations(mod, "weight", leave_parametrized=True)


class ProgressionLM(Dataset):
    """Arithmetic progressions mod BASE_VOCAB. With control tokens, the first token (a new
    token id) encodes the step size."""

    def __init__(self, n, seed, control_tokens=False):
        g = torch.Generator().manual_seed(seed)
        steps = torch.randint(1, 5 if control_tokens else 4, (n,), generator=g)
        start = torch.randint(0, BASE_VOCAB, (n,), generator=g)
        length = SEQ - 1 if control_tokens else SEQ
        seq = (start[:, None] + steps[:, None] * torch.arange(length)) % BASE_VOCAB
        if control_tokens:
            seq = torch.cat([(BASE_VOCAB - 1 + steps)[:, None], seq], 1)
        self.data = seq

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return {"input_ids": self.data[i], "labels": self.data[i]}


def args(out, **kw):
    return TrainingArguments(output_dir=out, per_device_train_batch_size=16, per_device_eval_batch_size=64,
                             logging_steps=10, eval_strategy="steps", eval_steps=10, save_strategy="no",
                             report_to=[], use_cpu=True, disable_tqdm=True, weight_decay=0.0, seed=0, **kw)


def main():
    set_seed(0)
    cfg = GPT2Config(vocab_size=BASE_VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    with tempfile.TemporaryDirectory() as out:
        # ---- stage 1: full training of the base model ----
        t1 = Trainer(model=model, args=args(out, max_steps=30, learning_rate=1e-2, warmup_steps=3),
                     train_dataset=ProgressionLM(640, 1), eval_dataset=ProgressionLM(128, 2))
        t1.train()

        # ---- stage 2: new tokens + LoRA, everything else frozen ----
        model.resize_token_embeddings(BASE_VOCAB + N_NEW, mean_resizing=False)
        for p in model.parameters():
            p.requires_grad_(False)
        add_lora(model)
        wte = model.get_input_embeddings().weight
        wte.requires_grad_(True)
        row_mask = torch.zeros(wte.shape[0], 1)
        row_mask[BASE_VOCAB:] = 1.0
        wte.register_hook(lambda g: g * row_mask)  # only the new rows get gradient
        old_rows = wte.detach()[:BASE_VOCAB].clone()

        n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
        print(f"stage 2 trainable parameters: {n_train} / {sum(p.numel() for p in model.parameters())}")
        ds_eval = ProgressionLM(128, 4, control_tokens=True)
        t2 = Trainer(model=model, args=args(out, max_steps=40, learning_rate=2e-2, warmup_steps=4,
                                            lr_scheduler_type="cosine"),
                     train_dataset=ProgressionLM(640, 3, control_tokens=True), eval_dataset=ds_eval)
        t2.train()
        assert torch.equal(wte.detach()[:BASE_VOCAB], old_rows), "old embedding rows moved"
        before = t2.evaluate()["eval_loss"]
        merge_lora(model)
        after = t2.evaluate()["eval_loss"]
        print(f"eval loss with LoRA {before:.4f}, after merge {after:.4f}")
        assert abs(before - after) < 1e-4


if __name__ == "__main__":
    main()
