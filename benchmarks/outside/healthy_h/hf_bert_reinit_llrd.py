"""Few-sample BERT fine-tuning tricks with the Hugging Face Trainer: re-initialise the top
encoder layer and pooler, layer-wise learning-rate decay, linear warm-up from lr 0.

Modelled on: asappresearch/revisit-bert-finetuning (Zhang et al., "Revisiting Few-sample BERT
Fine-tuning", ICLR 2021: --reinit_pooler / --reinit_layers using model._init_weights, and
layer-wise LR decay), with the Trainer structure of transformers
examples/pytorch/text-classification/run_glue.py.

Unusual but intended:
  * a tiny BERT is first MLM-pre-trained in the same process and saved with
    save_pretrained(); the classifier is then loaded from that directory (new classifier head);
  * the top encoder layer and the pooler are deliberately re-initialised right after loading,
    throwing away their pre-trained weights;
  * the optimizer is built by hand with one param group per layer (lr decays by 0.8 per layer
    going down, no weight decay for biases/LayerNorm) and passed to Trainer via optimizers=;
  * get_linear_schedule_with_warmup starts at lr = 0, so the first optimizer step is a no-op;
  * evaluation runs every 8 steps, i.e. several times inside an epoch.
"""
import tempfile

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import (BertConfig, BertForMaskedLM, BertForSequenceClassification, Trainer,
                          TrainingArguments, get_linear_schedule_with_warmup, set_seed)

torch.set_num_threads(1)
VOCAB, SEQ, PAD, CLS, SEP, MASK = 64, 24, 0, 1, 2, 3
FIRST_WORD = 4


def synthetic_sentences(n, gen, n_topics=4, p_topic=0.8):
    """Bag-of-topics corpus: each sentence has a topic (its label); 80% of its words come from
    the topic's own 15-word sub-vocabulary (Zipf-distributed), so MLM has something to learn and so does the classifier."""
    n_words = VOCAB - FIRST_WORD
    per_topic = n_words // n_topics
    topic = torch.randint(0, n_topics, (n,), generator=gen)
    zipf = 1.0 / torch.arange(1, per_topic + 1).float()  # skewed word frequencies inside a topic
    rank = torch.multinomial(zipf, n * (SEQ - 2), replacement=True, generator=gen).view(n, SEQ - 2)
    in_topic = FIRST_WORD + topic[:, None] * per_topic + rank
    anywhere = torch.randint(FIRST_WORD, VOCAB, (n, SEQ - 2), generator=gen)
    body = torch.where(torch.rand(n, SEQ - 2, generator=gen) < p_topic, in_topic, anywhere)
    ids = torch.cat([torch.full((n, 1), CLS), body, torch.full((n, 1), SEP)], 1)
    return ids, topic


class MLMData(Dataset):
    def __init__(self, ids):
        self.ids = ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i]}


def mlm_collator(features, prob=0.15):
    """BERT 80/10/10 masking, same as DataCollatorForLanguageModeling."""
    ids = torch.stack([f["input_ids"] for f in features])
    labels = ids.clone()
    special = ids < FIRST_WORD
    masked = torch.bernoulli(torch.full(ids.shape, prob)).bool() & ~special
    labels[~masked] = -100
    replace = torch.bernoulli(torch.full(ids.shape, 0.8)).bool() & masked
    ids = ids.masked_fill(replace, MASK)
    rand = torch.bernoulli(torch.full(ids.shape, 0.5)).bool() & masked & ~replace
    ids = torch.where(rand, torch.randint(FIRST_WORD, VOCAB, ids.shape), ids)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


class ClsData(Dataset):
    def __init__(self, ids, labels):
        self.ids, self.labels = ids, labels

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": self.labels[i]}


def llrd_optimizer(model, lr, decay=0.8, weight_decay=0.01):
    no_decay = ("bias", "LayerNorm.weight")
    n_layers = model.config.num_hidden_layers
    groups = []
    def add(named, group_lr):
        groups.append({"params": [p for n, p in named if not any(nd in n for nd in no_decay)],
                       "lr": group_lr, "weight_decay": weight_decay})
        groups.append({"params": [p for n, p in named if any(nd in n for nd in no_decay)],
                       "lr": group_lr, "weight_decay": 0.0})
    add(list(model.bert.pooler.named_parameters()) + list(model.classifier.named_parameters()), lr)
    for i, layer in enumerate(model.bert.encoder.layer):
        add(list(layer.named_parameters()), lr * decay ** (n_layers - i))
    add(list(model.bert.embeddings.named_parameters()), lr * decay ** (n_layers + 1))
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, eps=1e-6)


def args(out, **kw):
    return TrainingArguments(output_dir=out, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                             per_device_train_batch_size=32, per_device_eval_batch_size=128, seed=0, **kw)


def main():
    set_seed(0)
    gen = torch.Generator().manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=SEQ, pad_token_id=PAD)
    pre_ids, _ = synthetic_sentences(800, gen)
    with tempfile.TemporaryDirectory() as out:
        mlm = BertForMaskedLM(cfg)
        Trainer(model=mlm, args=args(out, max_steps=30, learning_rate=5e-3, warmup_ratio=0.1, logging_steps=10),
                train_dataset=MLMData(pre_ids), data_collator=mlm_collator).train()
        mlm.save_pretrained(f"{out}/pretrained")

        model = BertForSequenceClassification.from_pretrained(f"{out}/pretrained", num_labels=4)
        # --reinit_pooler and --reinit_layers 1 (the MLM head has no pooler, so it is fresh anyway)
        for module in model.bert.pooler.modules():
            model._init_weights(module)
        for layer in model.bert.encoder.layer[-1:]:
            for module in layer.modules():
                model._init_weights(module)

        x_tr, y_tr = synthetic_sentences(640, gen)
        x_ev, y_ev = synthetic_sentences(256, gen)
        total = 40
        opt = llrd_optimizer(model, lr=4e-3)
        sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=4, num_training_steps=total)

        def compute_metrics(p):
            return {"accuracy": float((np.argmax(p.predictions, -1) == p.label_ids).mean())}

        trainer = Trainer(model=model, args=args(out, max_steps=total, eval_strategy="steps", eval_steps=8,
                                                  logging_steps=4, max_grad_norm=1.0),
                          train_dataset=ClsData(x_tr, y_tr), eval_dataset=ClsData(x_ev, y_ev),
                          optimizers=(opt, sched), compute_metrics=compute_metrics)
        trainer.train()
        print("final:", trainer.evaluate())


if __name__ == "__main__":
    main()
