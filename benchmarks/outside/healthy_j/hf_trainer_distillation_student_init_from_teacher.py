"""Task-specific knowledge distillation of a BERT classifier with a custom HF Trainer.

Modelled on: Philipp Schmid, "Task-specific knowledge distillation for BERT using
Transformers & Amazon SageMaker" (philschmid.de/knowledge-distillation-bert-transformers):
``DistillationTrainingArguments(alpha, temperature)`` and a ``DistillationTrainer`` whose
``compute_loss`` runs the frozen teacher under ``no_grad`` and mixes the student's
cross-entropy with ``KLDivLoss(reduction="batchmean")`` on temperature-softened logits
times ``T**2``; plus the DistilBERT student initialisation (Sanh et al. 2019,
transformers ``examples/research_projects/distillation/scripts/extract_distilbert.py``):
the student keeps every other transformer layer of the teacher.  Both models are built
from ``BertConfig`` (no downloads); the task is a synthetic two-class "topic" task.

What is unusual about the loop:
  * Two Trainer runs in one program: the teacher is fine-tuned first, then frozen
    (``eval()`` + ``requires_grad_(False)``) and only used for forward passes.
  * The student's freshly initialised weights are overwritten right after construction
    by copying the teacher's embeddings, layers 0 and 2, pooler and classifier.
  * The training loss is not the model's own loss: ``compute_loss`` is overridden and the
    model is called without labels.
  * Evaluation every 10 steps, in the middle of the epoch.
"""
import tempfile
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainingArguments,
                          set_seed)

torch.set_num_threads(1)
set_seed(42)

VOCAB, SEQ_LEN = 200, 32


class TopicDataset(torch.utils.data.Dataset):
    """Label 1 sequences draw more often from the upper half of the vocabulary."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        base = torch.ones(VOCAB - 5)
        p0 = base.clone()
        p0[: (VOCAB - 5) // 2] *= 4.0
        p1 = base.clone()
        p1[(VOCAB - 5) // 2:] *= 4.0
        probs = torch.stack([p0 / p0.sum(), p1 / p1.sum()])
        ids = torch.multinomial(probs[self.labels], SEQ_LEN - 2, replacement=True, generator=g) + 5
        cls, sep = torch.full((n, 1), 2), torch.full((n, 1), 3)
        self.input_ids = torch.cat([cls, ids, sep], dim=1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "attention_mask": torch.ones(SEQ_LEN, dtype=torch.long),
                "labels": self.labels[i]}


@dataclass
class DistillationTrainingArguments(TrainingArguments):
    alpha: float = field(default=0.5, metadata={"help": "weight of the hard-label loss"})
    temperature: float = field(default=2.0, metadata={"help": "softmax temperature"})


class DistillationTrainer(Trainer):
    def __init__(self, *args, teacher_model=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher = teacher_model
        self.teacher.eval()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs_student = model(**inputs)
        with torch.no_grad():
            outputs_teacher = self.teacher(**inputs)
        student_loss = F.cross_entropy(outputs_student.logits, labels)
        T = self.args.temperature
        loss_function = nn.KLDivLoss(reduction="batchmean")
        loss_logits = loss_function(F.log_softmax(outputs_student.logits / T, dim=-1),
                                    F.softmax(outputs_teacher.logits / T, dim=-1)) * (T ** 2)
        loss = self.args.alpha * student_loss + (1.0 - self.args.alpha) * loss_logits
        return (loss, outputs_student) if return_outputs else loss


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


@torch.no_grad()
def init_student_from_teacher(student, teacher, layer_map):
    s, t = student.bert, teacher.bert
    s.embeddings.load_state_dict(t.embeddings.state_dict())
    for s_idx, t_idx in enumerate(layer_map):
        s.encoder.layer[s_idx].load_state_dict(t.encoder.layer[t_idx].state_dict())
    s.pooler.load_state_dict(t.pooler.state_dict())
    student.classifier.load_state_dict(teacher.classifier.state_dict())


def common_args(out_dir, **kw):
    return dict(output_dir=out_dir, per_device_train_batch_size=32, per_device_eval_batch_size=64,
                eval_strategy="steps", eval_steps=10, logging_steps=10, save_strategy="no",
                report_to=[], use_cpu=True, disable_tqdm=True, seed=42, **kw)


def main():
    train_ds, eval_ds = TopicDataset(960, seed=1), TopicDataset(256, seed=2)
    teacher_cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4,
                             num_attention_heads=4, intermediate_size=128,
                             max_position_embeddings=SEQ_LEN, num_labels=2)
    teacher = BertForSequenceClassification(teacher_cfg)

    with tempfile.TemporaryDirectory() as tmp:
        t_args = TrainingArguments(**common_args(f"{tmp}/teacher", max_steps=40, learning_rate=2e-3,
                                                 warmup_steps=3, weight_decay=0.01))
        t_trainer = Trainer(model=teacher, args=t_args, train_dataset=train_ds, eval_dataset=eval_ds,
                            compute_metrics=compute_metrics)
        t_trainer.train()
        print("teacher:", t_trainer.evaluate())

        teacher.requires_grad_(False)
        student_cfg = BertConfig(**{**teacher_cfg.to_dict(), "num_hidden_layers": 2})
        student = BertForSequenceClassification(student_cfg)
        init_student_from_teacher(student, teacher, layer_map=[0, 2])
        print("student (copied layers 0,2 of the teacher) before distillation:",
              Trainer(model=student, args=t_args, eval_dataset=eval_ds,
                      compute_metrics=compute_metrics).evaluate())

        s_args = DistillationTrainingArguments(**common_args(f"{tmp}/student", max_steps=30,
                                                             learning_rate=5e-4, warmup_ratio=0.1,
                                                             lr_scheduler_type="cosine"),
                                               alpha=0.5, temperature=4.0)
        s_trainer = DistillationTrainer(model=student, args=s_args, teacher_model=teacher,
                                        train_dataset=train_ds, eval_dataset=eval_ds,
                                        compute_metrics=compute_metrics)
        s_trainer.train()
        print("student after distillation:", s_trainer.evaluate())
        n_t = sum(p.numel() for p in teacher.parameters())
        n_s = sum(p.numel() for p in student.parameters())
        print(f"teacher params {n_t}, student params {n_s} ({n_s / n_t:.0%})")


if __name__ == "__main__":
    main()
