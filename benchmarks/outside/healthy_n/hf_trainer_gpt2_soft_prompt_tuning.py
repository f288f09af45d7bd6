"""Soft prompt tuning of a frozen GPT-2 with the HF Trainer (after a short base-model pre-train).

Modelled on: kipgparker/soft-prompt-tuning (``soft_embedding.py``: a ``SoftEmbedding`` that wraps
GPT-2's ``wte``, initialises ``n_tokens`` learned vectors from the first vocabulary rows, and
replaces the embeddings of ``n_tokens`` placeholder ids prepended to every input; the model's
input embedding is swapped with ``model.set_input_embeddings``), implementing Lester, Al-Rfou &
Constant, "The Power of Scale for Parameter-Efficient Prompt Tuning", EMNLP 2021.

Stage 1 builds a small GPT-2 from a config and pre-trains it for a few steps on synthetic text
from two "domains", each document opening with a CTRL-style control code (a stand-in for
downloading a checkpoint); it is saved with ``save_pretrained`` and reloaded with
``from_pretrained`` for stage 2, exactly as a real checkpoint would be.  Stage 2 learns a soft
prompt that steers the frozen model towards domain B without the control code.

What is unusual about the run (deliberate):
  * Stage 2 freezes *every* GPT-2 weight; the only trainable tensor is the 8 x d soft prompt,
    so the optimizer holds a single parameter and the rest of the network gets no gradient.
  * The model is rebuilt between the two stages (new Trainer, new optimizer, new scheduler).
  * Gradient checkpointing is enabled on the frozen model (the gradient still has to flow
    back through every block to reach the prompt at the input).
  * The prompt positions carry placeholder ids whose embeddings are overwritten, and their
    labels are -100.
  * The learned prompt starts as a copy of real vocabulary embeddings (initialize_from_vocab).
"""
import tempfile

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

torch.set_num_threads(1)

DOMAIN_A, DOMAIN_B, EOS = 60, 61, 63
VOCAB, N_PROMPT, SEQ = 64, 8, 24
# two "domains" of text with different word-transition tables (think: two writing styles)
_T = np.random.default_rng(1234)
TABLES = {DOMAIN_A: _T.integers(0, 48, size=(48, 2)), DOMAIN_B: _T.integers(0, 48, size=(48, 2))}


def sample_text(rng, domain, length):
    table, out = TABLES[domain], [int(rng.integers(48))]
    for _ in range(length - 1):
        out.append(int(table[out[-1], 0 if rng.random() < 0.75 else 1]) if rng.random() > 0.05
                   else int(rng.integers(48)))
    return out


class SoftEmbedding(nn.Module):
    def __init__(self, wte: nn.Embedding, n_tokens=10, random_range=0.5, initialize_from_vocab=True):
        super().__init__()
        self.wte = wte
        self.n_tokens = n_tokens
        self.learned_embedding = nn.Parameter(
            self.initialize_embedding(wte, n_tokens, random_range, initialize_from_vocab))

    def initialize_embedding(self, wte, n_tokens, random_range, initialize_from_vocab):
        if initialize_from_vocab:
            return wte.weight[:n_tokens].clone().detach()
        return torch.empty(n_tokens, wte.weight.size(1)).uniform_(-random_range, random_range)

    def forward(self, tokens):
        input_embedding = self.wte(tokens[:, self.n_tokens:])
        learned_embedding = self.learned_embedding.repeat(input_embedding.size(0), 1, 1)
        return torch.cat([learned_embedding, input_embedding], 1)


class ControlCodeLMDataset(Dataset):
    """Stage 1: every document starts with its domain control code (as in CTRL)."""

    def __init__(self, n, rng):
        self.x = []
        for _ in range(n):
            d = DOMAIN_A if rng.random() < 0.5 else DOMAIN_B
            self.x.append([d] + sample_text(rng, d, SEQ) + [EOS])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        ids = torch.tensor(self.x[i])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


class PromptedDomainBDataset(Dataset):
    """Stage 2: domain-B text *without* its control code; a soft prompt is learned instead.

    ``N_PROMPT`` placeholder ids are prepended (their embeddings are replaced by the soft prompt)
    and their labels are -100.
    """

    def __init__(self, n, rng, with_code=False):
        self.with_code = with_code
        self.x = [sample_text(rng, DOMAIN_B, SEQ) + [EOS] for _ in range(n)]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        head = [EOS] * (N_PROMPT - 1) + [DOMAIN_B] if self.with_code else [EOS] * N_PROMPT
        ids = torch.tensor(head + self.x[i])
        labels = ids.clone()
        labels[:N_PROMPT] = -100
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def lm_loss(model, ds):
    model.eval()
    batch = [ds[i] for i in range(len(ds))]
    with torch.no_grad():
        out = model(input_ids=torch.stack([b["input_ids"] for b in batch]),
                    labels=torch.stack([b["labels"] for b in batch]))
    return out.loss.item()


def main():
    set_seed(0)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        # ---- stage 1: base LM (stands in for a downloaded checkpoint)
        config = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                            bos_token_id=EOS, eos_token_id=EOS)
        base = GPT2LMHeadModel(config)
        args = TrainingArguments(output_dir=f"{tmp}/base", max_steps=40, per_device_train_batch_size=32,
                                 learning_rate=3e-3, warmup_steps=3, logging_steps=10, save_strategy="no",
                                 report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
        Trainer(model=base, args=args, train_dataset=ControlCodeLMDataset(1280, rng)).train()
        base.save_pretrained(f"{tmp}/gpt2-tiny")
        # reference: the frozen base model *with* the real control code in the context
        eval_with_code = PromptedDomainBDataset(200, np.random.default_rng(7), with_code=True)
        print(f"domain-B eval loss with the true control code: {lm_loss(base, eval_with_code):.4f}")
        del base

        # ---- stage 2: prompt tuning on the frozen checkpoint
        model = GPT2LMHeadModel.from_pretrained(f"{tmp}/gpt2-tiny")
        for p in model.parameters():
            p.requires_grad = False
        s_wte = SoftEmbedding(model.get_input_embeddings(), n_tokens=N_PROMPT, initialize_from_vocab=True)
        model.set_input_embeddings(s_wte)
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        print("trainable parameters:", trainable, sum(p.numel() for p in model.parameters() if p.requires_grad))

        train_ds = PromptedDomainBDataset(640, rng)
        eval_ds = PromptedDomainBDataset(200, np.random.default_rng(7))
        print(f"domain-B eval loss, soft prompt before tuning: {lm_loss(model, eval_ds):.4f}")
        args = TrainingArguments(output_dir=f"{tmp}/prompt", max_steps=40, per_device_train_batch_size=32,
                                 per_device_eval_batch_size=100, learning_rate=3e-2, lr_scheduler_type="linear",
                                 warmup_steps=4, weight_decay=0.0, logging_steps=10, eval_strategy="steps",
                                 eval_steps=20, gradient_checkpointing=True, save_strategy="no", report_to=[],
                                 use_cpu=True, disable_tqdm=True, seed=0)
        trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds)
        frozen_before = model.transformer.h[0].attn.c_attn.weight.detach().clone()
        trainer.train()
        assert torch.equal(frozen_before, model.transformer.h[0].attn.c_attn.weight), "backbone must stay frozen"
        print(f"domain-B eval loss, soft prompt after tuning: {lm_loss(model, eval_ds):.4f}")
        print(f"soft prompt norm: {s_wte.learned_embedding.norm().item():.4f}")


if __name__ == "__main__":
    main()
