"""Vocabulary-expansion fine-tune whose "frozen" embedding rows keep moving (HF Trainer).

Bug class: parameters frozen by zeroing their gradient are still moved by the
optimizer (AdamW decoupled weight decay and the first-moment buffer built up
before the freeze).

Modelled on: huggingface/diffusers#1009 "Weight decay bug in
textual_inversion.py": the script freezes every word embedding except the new
token by zeroing their gradients after backward, but AdamW still applies weight
decay (and the stale Adam moments) to those rows, so the "frozen" pretrained
embeddings drift towards zero; the fix restores the original rows after every
optimizer step.  Here the same recipe is used for a small GPT-2 fine-tuned with
the HF ``Trainer``: after a short joint warm-up, the body is frozen with
``requires_grad_(False)`` and the token-embedding matrix (tied with the LM head)
is "frozen except for the added domain tokens" through a gradient-mask hook.

What goes wrong: from the freeze on, the rows of the original vocabulary get a
zero gradient, but AdamW keeps updating them: ``m`` still holds the warm-up
gradients and decoupled weight decay shrinks every row each step.  The original
vocabulary (and, through tying, the output layer) drifts although it is meant to
stay fixed; the loss still goes down because the new rows keep learning.

Healthy twin: the diffusers fix -- after every optimizer step the original
vocabulary rows are copied back from the snapshot taken at the freeze.

Onset: 128 examples / batch 8 = 16 optimizer steps per epoch; the freeze starts
at global_step 16 (start of epoch 1), so the first update that moves the
supposedly frozen rows is optimizer step K = 16 (of 64).
"""
import sys
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

VOCAB = 64
N_OLD = 48          # ids 0..47: original vocabulary; 48..63: added domain tokens
SEQ_LEN = 24
N_EXAMPLES = 128
FREEZE_AT = 16


def build_corpus(n, gen):
    """Old-vocabulary progressions with a domain token every fourth position."""
    starts = torch.randint(1, N_OLD, (n, 1), generator=gen)
    strides = torch.randint(1, 4, (n, 1), generator=gen)
    body = (starts + strides * torch.arange(SEQ_LEN)) % (N_OLD - 1) + 1
    domain = N_OLD + (starts + torch.arange(SEQ_LEN) // 4) % (VOCAB - N_OLD)
    pos = torch.arange(SEQ_LEN) % 4 == 3
    return torch.where(pos, domain, body)


class LMDataset(torch.utils.data.Dataset):
    def __init__(self, ids):
        self.ids = ids

    def __len__(self):
        return self.ids.shape[0]

    def __getitem__(self, i):
        x = self.ids[i]
        return {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x.clone()}


class FreezeBaseVocabulary(TrainerCallback):
    """After the warm-up, train only the embeddings of the added tokens."""

    def __init__(self, model):
        self.model = model
        self.snapshot = None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step != FREEZE_AT or self.snapshot is not None:
            return
        for name, p in self.model.named_parameters():
            if name != "transformer.wte.weight":
                p.requires_grad_(False)
        wte = self.model.transformer.wte.weight
        keep = torch.zeros(VOCAB, 1)
        keep[N_OLD:] = 1.0
        wte.register_hook(lambda g: g * keep)
        self.snapshot = wte.detach()[:N_OLD].clone()
        print(f"freezing the base vocabulary at step {state.global_step}")
        if not HEALTHY:
            print(f"ONSET step {state.global_step}")

    def on_optimizer_step(self, args, state, control, **kwargs):
        if HEALTHY and self.snapshot is not None:
            with torch.no_grad():
                self.model.transformer.wte.weight[:N_OLD] = self.snapshot

    def on_train_end(self, args, state, control, **kwargs):
        if self.snapshot is not None:
            drift = (self.model.transformer.wte.weight.detach()[:N_OLD] - self.snapshot).norm()
            print(f"base-vocabulary drift since freeze {drift:.4f}")


corpus = build_corpus(N_EXAMPLES, torch.Generator().manual_seed(7))
config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=32, n_layer=2, n_head=2,
                    bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config)

with tempfile.TemporaryDirectory() as tmp:
    args = TrainingArguments(
        output_dir=tmp,
        per_device_train_batch_size=8,
        num_train_epochs=4,
        learning_rate=3e-3,
        weight_decay=0.05,
        warmup_steps=4,
        logging_steps=8,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=LMDataset(corpus),
                      callbacks=[FreezeBaseVocabulary(model)])
    result = trainer.train()
    print(f"final train_loss {result.training_loss:.4f}")

print("done")
