"""MLM masking written in place into the cached dataset tensors (HF Trainer).

Bug class: data pipeline (in-place mutation of the stored dataset through a
tensor view, corrupting the data seen in later epochs).

Modelled on: huggingface/transformers#8619 "`DataCollatorForLanguageModeling`
modifies `input_ids` via `labels` variable" (fixed in #8621 "Fix
DataCollatorForLanguageModeling": "A clone was removed by mistake").  Without
the ``clone()`` the masking code wrote straight into a tensor that was still
referenced elsewhere.  Here the same mistake sits in a custom dataset's
``__getitem__``: ``self.input_ids[i]`` is a *view* into the pre-tokenised
corpus tensor, and dynamic masking writes ``[MASK]`` into it.

What goes wrong: during epoch 0 every example is returned correctly (labels are
cloned before masking), but the stored corpus now permanently contains the
epoch-0 ``[MASK]`` tokens.  From epoch 1 on, the model sees ~2x more masks than
configured and, worse, positions that were masked in epoch 0 now have
``[MASK]`` as their *label*, so the model is trained to predict ``[MASK]``.
The loss keeps decreasing (predicting [MASK] is easy), so nothing looks wrong.

Healthy twin: ``self.input_ids[i].clone()`` before masking.

Onset: 96 examples / batch 8 = 12 optimizer steps per epoch; the first batch
built from corrupted storage is used by optimizer step K = 12.
"""
import sys
import tempfile

import torch
from transformers import (BertConfig, BertForMaskedLM, Trainer, TrainerCallback,
                          TrainingArguments)

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3
N_SPECIAL = 4
VOCAB = 64
SEQ_LEN = 16
N_EXAMPLES = 96


def build_corpus(n, gen):
    """Arithmetic progressions over the non-special vocabulary: context predicts masked tokens."""
    body = SEQ_LEN - 2
    n_words = VOCAB - N_SPECIAL
    starts = torch.randint(0, n_words, (n, 1), generator=gen)
    strides = torch.randint(1, 4, (n, 1), generator=gen)
    tokens = (starts + strides * torch.arange(body)) % n_words + N_SPECIAL
    cls = torch.full((n, 1), CLS_ID)
    sep = torch.full((n, 1), SEP_ID)
    return torch.cat([cls, tokens, sep], dim=1)


class MLMDataset(torch.utils.data.Dataset):
    def __init__(self, input_ids, mlm_probability=0.15):
        self.input_ids = input_ids  # (N, L) pre-tokenised corpus
        self.mlm_probability = mlm_probability

    def __len__(self):
        return self.input_ids.shape[0]

    def __getitem__(self, i):
        if HEALTHY:
            input_ids = self.input_ids[i].clone()
        else:
            input_ids = self.input_ids[i]  # BUG: a view into the corpus, masked in place below
        labels = input_ids.clone()
        probs = torch.full(labels.shape, self.mlm_probability)
        probs[(labels == CLS_ID) | (labels == SEP_ID) | (labels == PAD_ID)] = 0.0
        masked = torch.bernoulli(probs).bool()
        labels[~masked] = -100
        input_ids[masked] = MASK_ID
        return {"input_ids": input_ids,
                "attention_mask": torch.ones_like(input_ids),
                "labels": labels}


class EpochLogger(TrainerCallback):
    def on_epoch_begin(self, args, state, control, **kwargs):
        epoch = round(state.epoch or 0)
        print(f"epoch {epoch} begins at step {state.global_step}")
        if epoch == 1 and not HEALTHY:
            print(f"ONSET step {state.global_step}")


corpus = build_corpus(N_EXAMPLES, torch.Generator().manual_seed(123))
train_ds = MLMDataset(corpus)

config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=SEQ_LEN, pad_token_id=PAD_ID)
model = BertForMaskedLM(config)

with tempfile.TemporaryDirectory() as tmp:
    args = TrainingArguments(
        output_dir=tmp,
        per_device_train_batch_size=8,
        num_train_epochs=3,
        learning_rate=5e-3,
        warmup_steps=0,
        weight_decay=0.0,
        logging_steps=4,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, callbacks=[EpochLogger()])
    result = trainer.train()
    print(f"final train_loss {result.training_loss:.4f}")

print("done")
