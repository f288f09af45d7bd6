"""Healthy probe: the Hugging Face Trainer docs' "customize the Trainer" recipes together: a Trainer subclass overriding compute_loss(model, inputs, return_outputs, num_items_in_batch) with a class-weighted nn.CrossEntropyLoss for an imbalanced three-way RobertaForSequenceClassification (built from a tiny config), and a TrainerCallback whose on_step_end freezes the embedding layer (requires_grad_(False)) after 4 optimizer steps, as gradual-freezing fine-tuning recipes do.

The frozen embeddings stay in the optimizer; Trainer's model.zero_grad() leaves their
gradients None, so AdamW skips them from then on. Evaluation goes through the same
compute_loss (return_outputs=True) with compute_metrics reporting accuracy.
"""
import tempfile

import numpy as np
import torch
from torch import nn
from transformers import RobertaConfig, RobertaForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

SEED, VOCAB, LENGTH, FREEZE_AFTER = 0, 80, 12, 4
torch.manual_seed(SEED)


class Reviews(torch.utils.data.Dataset):
    """Random token ids; the label depends on a few marker tokens and is skewed 6:3:1."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, VOCAB, (n, LENGTH), generator=g)
        draw = torch.rand(n, generator=g)
        self.labels = torch.where(draw < 0.6, 0, torch.where(draw < 0.9, 1, 2))
        self.ids[:, 1] = 3 + self.labels * 5  # a marker token the model can learn

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        ids = torch.cat([torch.tensor([0]), self.ids[i], torch.tensor([2])])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[i]}


class WeightedLossTrainer(Trainer):
    class_weights = torch.tensor([1.0, 2.0, 6.0])

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.get("logits")
        loss_fct = nn.CrossEntropyLoss(weight=self.class_weights.to(logits.device))
        loss = loss_fct(logits.view(-1, self.model.config.num_labels), labels.view(-1))
        return (loss, outputs) if return_outputs else loss


class FreezeEmbeddings(TrainerCallback):
    def __init__(self, after):
        self.after = after

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.after:
            for param in model.roberta.embeddings.parameters():
                param.requires_grad_(False)
            print(f"step {state.global_step}: embeddings frozen")


def accuracy(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


config = RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=LENGTH + 4, num_labels=3,
                       pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1)
model = RobertaForSequenceClassification(config)
args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, per_device_eval_batch_size=16,
                         max_steps=10, learning_rate=5e-4, weight_decay=0.01, warmup_steps=2, logging_steps=2,
                         eval_strategy="steps", eval_steps=5, save_strategy="no", report_to=[], use_cpu=True, seed=SEED)
trainer = WeightedLossTrainer(model=model, args=args, train_dataset=Reviews(96, 1), eval_dataset=Reviews(32, 2),
                              compute_metrics=accuracy, callbacks=[FreezeEmbeddings(FREEZE_AFTER)])
trainer.train()
assert not any(p.requires_grad for p in model.roberta.embeddings.parameters())
print(trainer.evaluate())
