"""Modelled on the HuggingFace Transformers docs task guide "Knowledge Distillation for
Computer Vision" (ImageDistilTrainer: a Trainer subclass overriding compute_loss with a
frozen teacher, temperature-scaled KL + hard-label CE) and on examples/pytorch/
image-classification/run_image_classification.py (Trainer, collate_fn with pixel_values,
accuracy compute_metrics).

Step 1: a teacher ViTForImageClassification (tiny ViTConfig, no from_pretrained) is trained
with the stock Trainer.  Step 2: a smaller student ViT is trained with the distillation
Trainer subclass under bf16 autocast on CPU (bf16=True), cosine schedule with warmup, and a
custom TrainerCallback that tracks teacher/student agreement after each evaluation.
Synthetic 3x16x16 images: 4 classes given by which quadrant holds a bright coloured blob."""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import (ViTConfig, ViTForImageClassification, Trainer, TrainingArguments,
                          TrainerCallback, set_seed)

set_seed(0)
g = torch.Generator().manual_seed(0)

class ImageDataset(torch.utils.data.Dataset):
    def __init__(self, n):
        self.labels = torch.randint(0, 4, (n,), generator=g)
        self.images = 0.3 * torch.randn(n, 3, 16, 16, generator=g)
        color = torch.rand(n, 3, generator=g) + 1.5
        for i, y in enumerate(self.labels.tolist()):
            r, c = divmod(y, 2)
            oy, ox = torch.randint(0, 3, (2,), generator=g).tolist()
            self.images[i, :, r * 8 + oy:r * 8 + oy + 6, c * 8 + ox:c * 8 + ox + 6] += color[i, :, None, None]
    def __len__(self): return len(self.labels)
    def __getitem__(self, i): return {"pixel_values": self.images[i], "label": int(self.labels[i])}

train_ds, eval_ds = ImageDataset(512), ImageDataset(128)

def collate_fn(examples):
    pixel_values = torch.stack([example["pixel_values"] for example in examples])
    labels = torch.tensor([example["label"] for example in examples])
    return {"pixel_values": pixel_values, "labels": labels}

def compute_metrics(p):
    return {"accuracy": float((np.argmax(p.predictions, axis=1) == p.label_ids).mean())}

def vit(hidden, layers):
    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=hidden,
                    num_hidden_layers=layers, num_attention_heads=4, intermediate_size=2 * hidden,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=4,
                    id2label={i: f"quadrant_{i}" for i in range(4)},
                    label2id={f"quadrant_{i}": i for i in range(4)})
    return ViTForImageClassification(cfg)

common = dict(per_device_eval_batch_size=64, remove_unused_columns=False, report_to=[], use_cpu=True,
              seed=0, dataloader_num_workers=0, logging_steps=8, disable_tqdm=True)

# ------------------------------------------------------------- 1. teacher
teacher = vit(64, 3)
t_args = TrainingArguments(output_dir="out/hf_vit_teacher", per_device_train_batch_size=32,
                           learning_rate=3e-3, warmup_ratio=0.1, max_steps=24, eval_strategy="no",
                           save_strategy="no", **common)
t_trainer = Trainer(model=teacher, args=t_args, train_dataset=train_ds, data_collator=collate_fn,
                    compute_metrics=compute_metrics)
t_trainer.train()
print("teacher:", t_trainer.evaluate(eval_ds))

# ------------------------------------------------------------- 2. distillation
class ImageDistilTrainer(Trainer):
    def __init__(self, teacher_model=None, student_model=None, temperature=None, lambda_param=None, *args, **kwargs):
        super().__init__(model=student_model, *args, **kwargs)
        self.teacher = teacher_model
        self.student = student_model
        self.loss_function = nn.KLDivLoss(reduction="batchmean")
        self.teacher.to(self.args.device)
        self.teacher.eval()
        self.temperature = temperature
        self.lambda_param = lambda_param

    def compute_loss(self, student, inputs, return_outputs=False, num_items_in_batch=None):
        student_output = student(**inputs)
        with torch.no_grad():
            teacher_output = self.teacher(**inputs)
        # Compute soft targets for teacher and student
        soft_teacher = F.softmax(teacher_output.logits.float() / self.temperature, dim=-1)
        soft_student = F.log_softmax(student_output.logits.float() / self.temperature, dim=-1)
        # Compute the loss
        distillation_loss = self.loss_function(soft_student, soft_teacher) * (self.temperature ** 2)
        # Compute the true label loss
        student_target_loss = student_output.loss
        # Calculate final loss
        loss = (1. - self.lambda_param) * student_target_loss + self.lambda_param * distillation_loss
        return (loss, student_output) if return_outputs else loss

class AgreementCallback(TrainerCallback):
    """after each evaluation, measure how often student and teacher predict the same class"""
    def __init__(self, teacher, dataset):
        self.teacher, self.dataset, self.history = teacher, dataset, []
    def on_evaluate(self, args, state, control, model=None, **kwargs):
        batch = collate_fn([self.dataset[i] for i in range(len(self.dataset))])
        was_training = model.training
        model.eval()
        with torch.no_grad():
            s = model(pixel_values=batch["pixel_values"]).logits.argmax(-1)
            t = self.teacher(pixel_values=batch["pixel_values"]).logits.argmax(-1)
        if was_training:
            model.train()
        agree = (s == t).float().mean().item()
        self.history.append((state.global_step, agree))
        print(f"[AgreementCallback] step {state.global_step}: student/teacher agreement {agree:.3f}")

for p in teacher.parameters():
    p.requires_grad_(False)
student = vit(32, 2)
s_args = TrainingArguments(output_dir="out/hf_vit_student", per_device_train_batch_size=32,
                           learning_rate=2e-3, weight_decay=0.05, lr_scheduler_type="cosine", warmup_steps=4,
                           max_steps=32, eval_strategy="steps", eval_steps=8, save_strategy="steps",
                           save_steps=16, save_total_limit=1, bf16=True, max_grad_norm=1.0, **common)
agreement = AgreementCallback(teacher, eval_ds)
trainer = ImageDistilTrainer(student_model=student, teacher_model=teacher, temperature=4.0, lambda_param=0.5,
                             args=s_args, train_dataset=train_ds, eval_dataset=eval_ds,
                             data_collator=collate_fn, compute_metrics=compute_metrics, callbacks=[agreement])
trainer.train()
print("student:", trainer.evaluate())
print("agreement history:", agreement.history)
