"""Modelled on the HuggingFace Transformers task guide "Knowledge Distillation for Computer
Vision" (docs/source/en/tasks/knowledge_distillation_for_image_classification.md), which
subclasses Trainer as ImageDistilTrainer.

Exercises teacher-student training with two models in one program: a tiny ViT teacher is
first fine-tuned with a plain Trainer, then frozen (eval mode, no_grad forward, never in an
optimizer) inside a custom Trainer subclass that overrides compute_loss to mix the student's
hard-label loss with a temperature-scaled KL term; the student is a small ResNet built from
ResNetConfig. Both from small configs (no from_pretrained). Synthetic 32x32 images whose class
is the orientation of a stripe pattern.
"""
import math
import shutil
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import (ViTConfig, ViTForImageClassification, ResNetConfig, ResNetForImageClassification,
                          Trainer, TrainingArguments, set_seed)

torch.set_num_threads(1)
set_seed(0)
g = torch.Generator().manual_seed(0)


class StripeImages(torch.utils.data.Dataset):
    def __init__(self, n):
        yy, xx = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
        self.labels = torch.randint(0, 4, (n,), generator=g)
        angles = self.labels.float() * math.pi / 4
        phase = torch.rand(n, generator=g) * 6.28
        waves = torch.sin(0.8 * (xx[None] * torch.cos(angles)[:, None, None]
                                 + yy[None] * torch.sin(angles)[:, None, None]) + phase[:, None, None])
        self.pixel_values = waves[:, None].repeat(1, 3, 1, 1) + 0.3 * torch.randn(n, 3, 32, 32, generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"pixel_values": self.pixel_values[i], "labels": self.labels[i]}


train_ds, eval_ds = StripeImages(384), StripeImages(128)


def compute_metrics(eval_pred):
    predictions, labels = eval_pred
    return {"accuracy": float((np.argmax(predictions, axis=1) == labels).mean())}


# ---- 1. fine-tune the teacher --------------------------------------------------------------
shutil.rmtree("out/hf_vit_distill_trainer", ignore_errors=True)
teacher_model = ViTForImageClassification(ViTConfig(
    image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=128, num_labels=4, id2label={i: f"angle_{45 * i}" for i in range(4)},
    label2id={f"angle_{45 * i}": i for i in range(4)}))
teacher_args = TrainingArguments(output_dir="out/hf_vit_distill_trainer/teacher", num_train_epochs=2,
                                 per_device_train_batch_size=32, learning_rate=1e-3, warmup_ratio=0.1,
                                 eval_strategy="epoch", save_strategy="no", logging_steps=6,
                                 report_to=[], use_cpu=True, seed=0, dataloader_num_workers=0)
teacher_trainer = Trainer(model=teacher_model, args=teacher_args, train_dataset=train_ds, eval_dataset=eval_ds,
                          compute_metrics=compute_metrics)
teacher_trainer.train()
print("teacher:", teacher_trainer.evaluate())


# ---- 2. distil into a small student --------------------------------------------------------
class ImageDistilTrainer(Trainer):
    def __init__(self, teacher_model=None, student_model=None, temperature=None, lambda_param=None, *args, **kwargs):
        super().__init__(model=student_model, *args, **kwargs)
        self.teacher = teacher_model
        self.student = student_model
        self.loss_function = nn.KLDivLoss(reduction="batchmean")
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.teacher.to(device)
        self.teacher.eval()
        self.temperature = temperature
        self.lambda_param = lambda_param

    def compute_loss(self, student, inputs, return_outputs=False, num_items_in_batch=None):
        student_output = student(**inputs)
        with torch.no_grad():
            teacher_output = self.teacher(**inputs)
        # Compute soft targets for teacher and student
        soft_teacher = F.softmax(teacher_output.logits / self.temperature, dim=-1)
        soft_student = F.log_softmax(student_output.logits / self.temperature, dim=-1)
        # Compute the loss
        distillation_loss = self.loss_function(soft_student, soft_teacher) * (self.temperature ** 2)
        # Compute the true label loss
        student_target_loss = student_output.loss
        # Calculate final loss
        loss = (1.0 - self.lambda_param) * student_target_loss + self.lambda_param * distillation_loss
        return (loss, student_output) if return_outputs else loss


student_model = ResNetForImageClassification(ResNetConfig(
    num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
    downsample_in_first_stage=False, num_labels=4))
student_args = TrainingArguments(output_dir="out/hf_vit_distill_trainer/student", num_train_epochs=3,
                                 per_device_train_batch_size=32, learning_rate=3e-3, eval_strategy="epoch",
                                 save_strategy="epoch", load_best_model_at_end=True, metric_for_best_model="accuracy",
                                 save_total_limit=1, logging_steps=6, report_to=[], use_cpu=True, seed=0,
                                 dataloader_num_workers=0)
trainer = ImageDistilTrainer(student_model=student_model, teacher_model=teacher_trainer.model,
                             args=student_args, train_dataset=train_ds, eval_dataset=eval_ds,
                             compute_metrics=compute_metrics, temperature=5, lambda_param=0.5)
trainer.train()
print("student:", trainer.evaluate(eval_ds))
