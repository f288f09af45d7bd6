"""FreeLB adversarial fine-tuning of a BERT classifier with a subclassed HF Trainer.

Modelled on: zhuchen03/FreeLB (Zhu et al., "FreeLB: Enhanced Adversarial Training for Natural
Language Understanding", ICLR 2020), ``huggingface-transformers/examples/run_glue_freelb.py``:
the word embeddings are looked up once, a random perturbation ``delta`` (uniform, scaled by
``adv_init_mag / sqrt(len * hidden)``, zero on padding) is added, and for ``adv_steps`` ascent
steps the model is run on ``inputs_embeds = embeds_init + delta``; each step's loss is divided
by ``adv_steps`` and back-propagated, so parameter gradients *accumulate* over the K ascent
steps ("free" adversarial training), while ``delta`` is moved along its own normalised
gradient (L2 ascent) and projected back into an ``adv_max_norm`` ball.  The loop is placed in
``Trainer.training_step`` as the transformers docs suggest for custom training steps.
The adversarial radii are scaled down from the paper's GLUE values because randomly
initialised embeddings (std 0.02, token norm ~0.16) are much smaller than pretrained ones.

Unusual (but intended) things about the loop:
* K=3 forward/backward passes per optimizer step; the returned training loss is the average
  over the adversarial passes, not a clean-input loss;
* ``delta`` is a non-parameter leaf tensor whose ``.grad`` is read and which is then rebuilt
  with ``.detach()`` each ascent step; the embedding lookup is recomputed every pass (the
  previous graph is freed by backward) so the embedding matrix receives K gradient
  contributions;
* evaluation (clean inputs, stock ``prediction_step``) runs every 10 steps, mid-epoch;
  warm-up from lr 0, linear decay, grad-norm clipping by the Trainer after the K passes.
"""
import os
import tempfile

import numpy as np
import torch
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainingArguments,
                          set_seed)

torch.set_num_threads(1)
set_seed(0)

VOCAB, PAD, CLS, SEP = 80, 0, 1, 2
POS_WORDS = np.arange(3, 13)     # "great", "love", ... (ids)
NEG_WORDS = np.arange(13, 23)    # "awful", "hate", ...
NEUTRAL = np.arange(23, VOCAB)


class ReviewDataset(torch.utils.data.Dataset):
    """Synthetic sentiment reviews: positive cue words (label 1) or negative ones (label 0)."""

    def __init__(self, n, seed):
        rng = np.random.default_rng(seed)
        self.items = []
        while len(self.items) < n:
            length = int(rng.integers(10, 30))
            n_pos, n_neg = rng.integers(0, 6, size=2)
            if n_pos == n_neg:
                continue
            n_pos, n_neg = (n_pos, 0) if n_pos > n_neg else (0, n_neg)  # one polarity per review
            toks = np.concatenate([rng.choice(POS_WORDS, n_pos), rng.choice(NEG_WORDS, n_neg),
                                   rng.choice(NEUTRAL, max(length - n_pos - n_neg, 1))])
            rng.shuffle(toks)
            self.items.append(([CLS] + toks.tolist() + [SEP], int(n_pos > n_neg)))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        ids, label = self.items[i]
        return {"input_ids": ids, "labels": label}


def pad_collate(features):
    max_len = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), max_len), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, f in enumerate(features):
        ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[i, : len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask,
            "labels": torch.tensor([f["labels"] for f in features])}


class FreeLBTrainer(Trainer):
    def __init__(self, *args, adv_steps=3, adv_lr=0.01, adv_init_mag=0.01, adv_max_norm=0.1, **kwargs):
        super().__init__(*args, **kwargs)
        self.adv_steps, self.adv_lr = adv_steps, adv_lr
        self.adv_init_mag, self.adv_max_norm = adv_init_mag, adv_max_norm

    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        inputs = self._prepare_inputs(inputs)
        input_ids = inputs.pop("input_ids")
        word_embeddings = model.get_input_embeddings()
        embeds_init = word_embeddings(input_ids)

        input_mask = inputs["attention_mask"].to(embeds_init)
        input_lengths = torch.sum(input_mask, 1)
        delta = torch.zeros_like(embeds_init).uniform_(-1, 1) * input_mask.unsqueeze(2)
        dims = input_lengths * embeds_init.size(-1)
        mag = self.adv_init_mag / torch.sqrt(dims)
        delta = (delta * mag.view(-1, 1, 1)).detach()

        total_loss = torch.zeros((), device=embeds_init.device)
        for astep in range(self.adv_steps):
            delta.requires_grad_()
            adv_inputs = dict(inputs, inputs_embeds=delta + embeds_init)
            with self.compute_loss_context_manager():
                loss = self.compute_loss(model, adv_inputs)
            loss = loss / self.adv_steps
            total_loss += loss.detach()
            self.accelerator.backward(loss)

            if astep == self.adv_steps - 1:
                break
            # (2) ascent on delta along its normalised gradient, then project to the L2 ball
            delta_grad = delta.grad.clone().detach()
            denorm = torch.norm(delta_grad.view(delta_grad.size(0), -1), dim=1).view(-1, 1, 1)
            denorm = torch.clamp(denorm, min=1e-8)
            delta = (delta + self.adv_lr * delta_grad / denorm).detach()
            if self.adv_max_norm > 0:
                delta_norm = torch.norm(delta.view(delta.size(0), -1).float(), p=2, dim=1).detach()
                exceed_mask = (delta_norm > self.adv_max_norm).to(embeds_init)
                reweights = (self.adv_max_norm / delta_norm * exceed_mask
                             + (1 - exceed_mask)).view(-1, 1, 1)
                delta = (delta * reweights).detach()
            # the embedding graph was freed by backward: look the embeddings up again
            embeds_init = word_embeddings(input_ids)
        return total_loss


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def main():
    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64, num_labels=2,
                        pad_token_id=PAD)
    model = BertForSequenceClassification(config)
    args = TrainingArguments(
        output_dir=os.path.join(tempfile.mkdtemp(), "freelb"), per_device_train_batch_size=32,
        per_device_eval_batch_size=128, learning_rate=3e-3, warmup_steps=5, weight_decay=0.01,
        max_steps=45, lr_scheduler_type="linear", max_grad_norm=1.0, logging_steps=5,
        eval_strategy="steps", eval_steps=10, save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True, seed=0)
    trainer = FreeLBTrainer(model=model, args=args, train_dataset=ReviewDataset(1024, seed=0),
                            eval_dataset=ReviewDataset(256, seed=1), data_collator=pad_collate,
                            compute_metrics=compute_metrics)
    trainer.train()
    print("final", trainer.evaluate())


if __name__ == "__main__":
    main()
