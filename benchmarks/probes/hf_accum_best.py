"""Healthy probe: Hugging Face Trainer image classification (examples/pytorch/image-classification/run_image_classification.py options) with a ResNetForImageClassification built from a tiny config (BatchNorm): gradient_accumulation_steps=4, max_grad_norm=0.5, lr_scheduler_type="cosine_with_restarts", label_smoothing_factor=0.1, and load_best_model_at_end=True with evaluation and checkpointing every 3 optimizer steps into a temporary output_dir (save_total_limit=2, best by eval_loss).

Training stops at step 10, one step past the last evaluation and checkpoint (step 9), so
at the end Trainer rolls the live model back to an earlier checkpoint's weights with
load_state_dict; the program then evaluates that model once more.
"""
import tempfile

import torch
from transformers import ResNetConfig, ResNetForImageClassification, Trainer, TrainingArguments

SEED, CLASSES = 0, 4
torch.manual_seed(SEED)


class Shapes(torch.utils.data.Dataset):
    """16x16 RGB images whose class is the quadrant holding a bright blob, plus noise."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, CLASSES, (n,), generator=g)
        self.images = 0.5 * torch.randn(n, 3, 16, 16, generator=g)
        for i, label in enumerate(self.labels.tolist()):
            r, c = divmod(label, 2)
            self.images[i, :, r * 8 + 2:r * 8 + 6, c * 8 + 2:c * 8 + 6] += 2.0

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"pixel_values": self.images[i], "labels": self.labels[i]}


config = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
                      num_labels=CLASSES, downsample_in_first_stage=False)
model = ResNetForImageClassification(config)
out = tempfile.mkdtemp()
args = TrainingArguments(
    output_dir=out, per_device_train_batch_size=4, per_device_eval_batch_size=16, gradient_accumulation_steps=4,
    max_steps=10, learning_rate=2e-3, weight_decay=0.05, max_grad_norm=0.5, lr_scheduler_type="cosine_with_restarts",
    lr_scheduler_kwargs={"num_cycles": 2}, warmup_steps=1, label_smoothing_factor=0.1,
    eval_strategy="steps", eval_steps=3, save_strategy="steps", save_steps=3, save_total_limit=2,
    load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=False,
    logging_steps=3, report_to=[], use_cpu=True, seed=SEED, remove_unused_columns=False)
trainer = Trainer(model=model, args=args, train_dataset=Shapes(160, 1), eval_dataset=Shapes(32, 2))
trainer.train()
print("best checkpoint", trainer.state.best_model_checkpoint, "best eval_loss", trainer.state.best_metric)
print(trainer.evaluate())
