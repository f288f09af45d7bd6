"""Generative next-item recommendation with semantic IDs: every item is a tuple
of 3 codebook tokens, a user's history is flattened into a token sequence and a
small GPT-2 is fine-tuned with the HF Trainer to generate the next item's
semantic ID after a separator.  A custom data collator pads the batch and masks
the prompt (history) part of the labels.

Modelled on: wangshy31/OneRec-Think#8 "about padding in train_beauty_sid_rec.py":
the script's ``CustomDataCollator`` builds ``label = padded_ids.copy()`` and
sets -100 only on the prompt part, "but the padding part of the label is not
set to -100, which means padding also contributes to the loss" (the other
script uses DataCollatorForLanguageModeling, which masks pad tokens).  Most
users here have a full 5-item history, so most batches have no padding and
train correctly; the first batch that contains a cold-start user (shorter
history) starts teaching the model to emit PAD after EOS and dilutes the loss
with trivially predictable tokens.  The fix masks padded positions with -100.

Unusual about the loop: Trainer subclass whose ``compute_loss`` also counts the
supervised tokens of each batch; cosine schedule with warm-up; labels built by
the collator, not by the model; GPT2Config model built from scratch.
Run: python p11_hf_trainer_semantic_id_rec_pad_labels.py [--healthy]
"""
import argparse
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.set_num_threads(1)
PAD, BOS, EOS, SEP = 0, 1, 2, 3
N_ITEMS, LEVELS, CB = 200, 3, 16
HEALTHY = False


def semantic_ids(n_items, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, CB, (n_items, LEVELS), generator=g)
    return [[4 + lvl * CB + int(c) for lvl, c in enumerate(row)] for row in codes]


class SIDRecDataset(torch.utils.data.Dataset):
    def __init__(self, n_users, seed):
        g = torch.Generator().manual_seed(seed)
        self.sid = semantic_ids(N_ITEMS)
        self.rows = []
        for u in range(n_users):
            hist_len = 5 if (u % 80) else int(torch.randint(1, 3, (1,), generator=g))  # cold-start users
            item = int(torch.randint(0, N_ITEMS, (1,), generator=g))
            hist = []
            for _ in range(hist_len + 1):
                hist.append(item)
                item = (item * 7 + 3 + int(torch.randint(0, 2, (1,), generator=g))) % N_ITEMS
            self.rows.append((hist[:-1], hist[-1]))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        hist, target = self.rows[i]
        prompt = [BOS] + [t for it in hist for t in self.sid[it]] + [SEP]
        ids = prompt + self.sid[target] + [EOS]
        return {"input_ids": ids, "attention_mask": [1] * len(ids), "prompt_len": len(prompt)}


class CustomDataCollator:
    def __call__(self, features):
        max_length = max(len(f["input_ids"]) for f in features)
        input_ids, attention_mask, labels = [], [], []
        for f in features:
            pad = max_length - len(f["input_ids"])
            padded_ids = f["input_ids"] + [PAD] * pad
            label = padded_ids.copy()
            label[:f["prompt_len"]] = [-100] * f["prompt_len"]   # do not train on the history
            if HEALTHY and pad:
                label[-pad:] = [-100] * pad
            input_ids.append(padded_ids)
            attention_mask.append(f["attention_mask"] + [0] * pad)
            labels.append(label)
        return {"input_ids": torch.tensor(input_ids), "attention_mask": torch.tensor(attention_mask),
                "labels": torch.tensor(labels)}


class RecTrainer(Trainer):
    onset_reported = False
    pad_label_tokens = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            n_pad_lab = int(((inputs["attention_mask"] == 0) & (inputs["labels"] != -100)).sum())
            RecTrainer.pad_label_tokens += n_pad_lab
            if n_pad_lab and not HEALTHY and not RecTrainer.onset_reported:
                RecTrainer.onset_reported = True
                print(f"ONSET step {self.state.global_step}")
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)


def main():
    global HEALTHY
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true")
    HEALTHY = parser.parse_args().healthy
    torch.manual_seed(0)

    train_ds = SIDRecDataset(960, seed=1)
    config = GPT2Config(vocab_size=4 + LEVELS * CB, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    model = GPT2LMHeadModel(config)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=16, max_steps=40,
                                 learning_rate=3e-3, lr_scheduler_type="cosine", warmup_steps=4,
                                 weight_decay=0.01, logging_steps=10, report_to=[], save_strategy="no",
                                 use_cpu=True, disable_tqdm=True, seed=3, remove_unused_columns=False)
        trainer = RecTrainer(model=model, args=args, train_dataset=train_ds,
                             data_collator=CustomDataCollator())
        trainer.train()

    # how much probability the model puts on PAD right after EOS for cold-start users
    model.eval()
    short = [train_ds[i] for i in range(0, 960, 80)][:8]
    full = train_ds[1]
    batch = CustomDataCollator()(short + [full])
    with torch.no_grad():
        probs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.softmax(-1)
    after_eos = []
    for i, f in enumerate(short):
        L = len(f["input_ids"])
        after_eos.append(probs[i, L - 1, PAD].item())   # prediction made at the EOS position
    print(f"EVIDENCE pad-label tokens trained on={RecTrainer.pad_label_tokens} "
          f"| mean P(PAD | EOS) for cold-start users={sum(after_eos) / len(after_eos):.3f}")


if __name__ == "__main__":
    main()
