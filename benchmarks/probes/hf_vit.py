"""Healthy probe: Hugging Face Trainer image classification with a ViT (examples/pytorch/image-classification), cosine schedule, clipping, gradient accumulation, DataLoader workers."""
import tempfile
import torch
from transformers import ViTConfig, ViTForImageClassification, Trainer, TrainingArguments
torch.manual_seed(0)
cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, num_labels=5, hidden_dropout_prob=0.1)
model = ViTForImageClassification(cfg)
class DS(torch.utils.data.Dataset):
    def __len__(self): return 96
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"pixel_values": torch.randn(3, 16, 16, generator=g), "labels": i % 5}
args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, max_steps=12, learning_rate=1e-3,
    lr_scheduler_type="cosine", weight_decay=0.05, max_grad_norm=1.0, gradient_accumulation_steps=2, logging_steps=4,
    report_to=[], save_strategy="no", eval_strategy="steps", eval_steps=6, use_cpu=True, dataloader_num_workers=2, seed=1)
Trainer(model=model, args=args, train_dataset=DS(), eval_dataset=DS()).train()
