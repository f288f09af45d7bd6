"""HF Trainer token classification (NER) with label smoothing over -100-masked labels.

Modelled on huggingface/transformers ``examples/pytorch/token-classification/run_ner.py``:
words are tokenized with ``is_split_into_words=True``, only the first sub-token of
each word carries the word's tag (``label_all_tokens=False``; continuation
sub-tokens and special tokens get -100), ``DataCollatorForTokenClassification``
pads labels with -100, and the run uses ``--label_smoothing_factor 0.1`` so the
Trainer's ``LabelSmoother`` computes the loss instead of the model.  The
tokenizer is a BertTokenizerFast built from a vocab file written at start-up;
the model is a tiny BertForTokenClassification from a config (no weights).

Unusual about the loop: the loss is not the model's own loss; the Trainer pops
the labels, smooths over all classes while skipping -100 positions, and many
positions (padding, [CLS]/[SEP], word pieces) contribute nothing; a sizeable
share of each batch is ignored.  Sequence lengths vary per batch (dynamic padding).
"""
import os
import random
import tempfile

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import (BertConfig, BertForTokenClassification, BertTokenizerFast,
                          DataCollatorForTokenClassification, Trainer, TrainingArguments)
from transformers.utils import logging as hf_logging

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG"]
FIRST = ["anna", "boris", "chen", "dara", "emil", "fatima"]
LAST = ["smith", "ivanova", "okafor", "larsen"]
PLACES = [("new", "york"), ("lagos",), ("oslo",), ("san", "diego"), ("kyoto",)]
ORGS = ["acme", "globex", "initech", "umbrella"]
FILLER = ["the", "a", "went", "to", "met", "with", "from", "works", "at", "in", "said", "today",
          "and", "visited", "company", "city", "yesterday", "about"]
# words that the tokenizer must split into word pieces
SPLIT = {"larsen": ["lar", "##sen"], "ivanova": ["ivan", "##ova"], "initech": ["init", "##ech"],
         "umbrella": ["umb", "##rella"], "kyoto": ["kyo", "##to"]}


def build_tokenizer(tmpdir):
    pieces = set(FIRST + LAST + ORGS + FILLER + [w for p in PLACES for w in p])
    for w, ps in SPLIT.items():
        pieces.discard(w)
        pieces.update(ps)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(pieces)
    path = os.path.join(tmpdir, "vocab.txt")
    with open(path, "w") as f:
        f.write("\n".join(vocab) + "\n")
    return BertTokenizerFast(vocab_file=path, do_lower_case=True)


def make_sentence(rng):
    words, tags = [], []
    for _ in range(rng.randint(2, 5)):
        kind = rng.random()
        if kind < 0.45:
            words.append(rng.choice(FILLER)); tags.append("O")
        elif kind < 0.65:
            words += [rng.choice(FIRST), rng.choice(LAST)]; tags += ["B-PER", "I-PER"]
        elif kind < 0.85:
            p = rng.choice(PLACES)
            words += list(p); tags += ["B-LOC"] + ["I-LOC"] * (len(p) - 1)
        else:
            words.append(rng.choice(ORGS)); tags.append("B-ORG")
        if rng.random() < 0.6:
            words.append(rng.choice(FILLER)); tags.append("O")
    return words, tags


class NerDataset(Dataset):
    def __init__(self, tokenizer, n, seed):
        rng = random.Random(seed)
        self.items = []
        for _ in range(n):
            words, tags = make_sentence(rng)
            enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=48)
            labels, prev = [], None
            for wid in enc.word_ids():
                if wid is None or wid == prev:
                    labels.append(-100)
                else:
                    labels.append(LABELS.index(tags[wid]))
                prev = wid
            self.items.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                               "labels": labels})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def compute_metrics(p):
    preds = np.argmax(p.predictions, axis=-1)
    mask = p.label_ids != -100
    return {"token_acc": float((preds[mask] == p.label_ids[mask]).mean())}


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        tok = build_tokenizer(tmp)
        train_ds, eval_ds = NerDataset(tok, 640, 1), NerDataset(tok, 160, 2)
        config = BertConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
                            num_labels=len(LABELS), id2label=dict(enumerate(LABELS)),
                            label2id={l: i for i, l in enumerate(LABELS)})
        model = BertForTokenClassification(config)
        args = TrainingArguments(
            output_dir=os.path.join(tmp, "out"), per_device_train_batch_size=16,
            per_device_eval_batch_size=32, num_train_epochs=2, learning_rate=1e-3,
            weight_decay=0.01, warmup_ratio=0.1, lr_scheduler_type="linear",
            label_smoothing_factor=0.1, eval_strategy="epoch", save_strategy="no",
            logging_steps=10, report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                          data_collator=DataCollatorForTokenClassification(tok),
                          compute_metrics=compute_metrics)
        trainer.train()
        for rec in trainer.state.log_history:
            if "loss" in rec:
                print(f"step {rec['step']:3d} loss {rec['loss']:.4f}")
            elif "eval_loss" in rec:
                print(f"epoch {rec['epoch']:.0f} eval_loss {rec['eval_loss']:.4f} token_acc {rec['eval_token_acc']:.3f}")


if __name__ == "__main__":
    main()
