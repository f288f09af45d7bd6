"""CLIP-style contrastive training of a VisionTextDualEncoder with the HF Trainer.

Modelled on: huggingface/transformers ``examples/pytorch/contrastive-image-text/run_clip.py``
(and its README): a vision tower and a text tower are glued together with
``VisionTextDualEncoderModel.from_vision_text_pretrained(...)``, the vision tower is frozen
with ``_freeze_params`` (``--freeze_vision_model``), a ``collate_fn`` returns
``pixel_values / input_ids / attention_mask / return_loss=True`` and the stock ``Trainer`` runs
the symmetric InfoNCE loss that the model computes itself.  Here the "pretrained" vision
checkpoint is produced by a short supervised ViT pre-training stage on synthetic shape images
and saved with ``save_pretrained`` to a temp dir, exactly where run_clip would load a hub model.

Unusual (but intended) things about the loop:
* two training stages with two different models/optimizers: a plain-loop ViT classifier, then
  the dual encoder built from its saved ViT weights (the classifier head is thrown away);
* the whole vision tower has ``requires_grad=False`` during the contrastive stage: its
  parameters never receive gradients and are checked to be bit-identical at the end, while the
  new projection layers and the learnable ``logit_scale`` temperature (init ln(1/0.07)) train;
* ``remove_unused_columns=False`` (pixel_values is not a text column), LR warm-up from 0, and
  evaluation every 10 steps, i.e. in the middle of the epoch.
"""
import os
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import (BertConfig, BertModel, BertTokenizerFast, Trainer, TrainingArguments,
                          ViTConfig, ViTModel, VisionTextDualEncoderModel, set_seed)

torch.set_num_threads(1)
set_seed(0)

COLORS = {"red": (1, 0, 0), "green": (0, 1, 0), "blue": (0, 0, 1),
          "yellow": (1, 1, 0), "purple": (1, 0, 1), "cyan": (0, 1, 1)}
SHAPES = ["square", "circle", "cross", "bar"]
IMG = 32


def draw(color, shape, rng):
    img = rng.normal(0.0, 0.08, (3, IMG, IMG)).astype(np.float32)
    cy, cx = rng.integers(10, 22, size=2)
    r = int(rng.integers(5, 9))
    yy, xx = np.mgrid[:IMG, :IMG]
    if shape == "square":
        m = (abs(yy - cy) <= r) & (abs(xx - cx) <= r)
    elif shape == "circle":
        m = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
    elif shape == "cross":
        m = ((abs(yy - cy) <= 1) & (abs(xx - cx) <= r)) | ((abs(xx - cx) <= 1) & (abs(yy - cy) <= r))
    else:
        m = (abs(yy - cy) <= 2) & (abs(xx - cx) <= r + 3)
    for ch, v in enumerate(COLORS[color]):
        img[ch][m] += v
    return (img - 0.25) / 0.5  # Normalize(mean, std) as in run_clip's Transform


def make_split(n, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        c = list(COLORS)[rng.integers(len(COLORS))]
        s = SHAPES[rng.integers(len(SHAPES))]
        rows.append({"image": draw(c, s, rng), "caption": f"a {c} {s}",
                     "class_id": list(COLORS).index(c) * len(SHAPES) + SHAPES.index(s)})
    return rows


class CaptionDataset(torch.utils.data.Dataset):
    def __init__(self, rows, tokenizer, max_seq_length=8):
        enc = tokenizer([r["caption"] for r in rows], max_length=max_seq_length,
                        padding="max_length", truncation=True)
        self.rows, self.enc = rows, enc

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"pixel_values": torch.from_numpy(self.rows[i]["image"]),
                "input_ids": self.enc["input_ids"][i], "attention_mask": self.enc["attention_mask"][i]}


def collate_fn(examples):
    pixel_values = torch.stack([example["pixel_values"] for example in examples])
    input_ids = torch.tensor([example["input_ids"] for example in examples], dtype=torch.long)
    attention_mask = torch.tensor([example["attention_mask"] for example in examples], dtype=torch.long)
    return {"pixel_values": pixel_values, "input_ids": input_ids,
            "attention_mask": attention_mask, "return_loss": True}


def _freeze_params(module):
    for param in module.parameters():
        param.requires_grad = False


def pretrain_vision_tower(rows, out_dir, steps=20):
    """Stand-in for downloading a pretrained ViT: quick supervised pre-training of a ViTModel
    (with its pooler, which the dual encoder uses) plus a throw-away linear head."""
    cfg = ViTConfig(image_size=IMG, patch_size=8, num_channels=3, hidden_size=64,
                    num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    vit = ViTModel(cfg)
    head = nn.Linear(cfg.hidden_size, len(COLORS) * len(SHAPES))
    params = list(vit.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.05)
    x = torch.from_numpy(np.stack([r["image"] for r in rows]))
    y = torch.tensor([r["class_id"] for r in rows])
    g = torch.Generator().manual_seed(1)
    vit.train()
    for step in range(steps):
        idx = torch.randint(0, len(rows), (64,), generator=g)
        logits = head(vit(pixel_values=x[idx]).pooler_output)
        loss = F.cross_entropy(logits, y[idx])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 5 == 0 or step == steps - 1:
            print(f"[vit pretrain] step {step} loss {loss.item():.4f}")
    vit.save_pretrained(out_dir)


@torch.no_grad()
def zero_shot_accuracy(model, tokenizer, rows):
    model.eval()
    prompts = [f"a {c} {s}" for c in COLORS for s in SHAPES]
    tok = tokenizer(prompts, padding="max_length", max_length=8, return_tensors="pt")
    text = F.normalize(model.get_text_features(**tok), dim=-1)
    pix = torch.from_numpy(np.stack([r["image"] for r in rows]))
    img = F.normalize(model.get_image_features(pixel_values=pix), dim=-1)
    pred = (img @ text.t()).argmax(-1)
    return (pred == torch.tensor([r["class_id"] for r in rows])).float().mean().item()


def main():
    tmp = tempfile.mkdtemp()
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"] + list(COLORS) + SHAPES
    with open(os.path.join(tmp, "vocab.txt"), "w") as f:
        f.write("\n".join(words) + "\n")
    tokenizer = BertTokenizerFast(os.path.join(tmp, "vocab.txt"))

    train_rows, eval_rows = make_split(768, seed=0), make_split(128, seed=1)

    vision_dir, text_dir = os.path.join(tmp, "vit"), os.path.join(tmp, "bert")
    pretrain_vision_tower(train_rows, vision_dir)
    BertModel(BertConfig(vocab_size=len(words), hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=128,
                         max_position_embeddings=16)).save_pretrained(text_dir)

    model = VisionTextDualEncoderModel.from_vision_text_pretrained(
        vision_dir, text_dir, projection_dim=32)
    _freeze_params(model.vision_model)  # --freeze_vision_model
    frozen_before = {k: v.clone() for k, v in model.vision_model.state_dict().items()}
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"trainable params {n_train} / {sum(p.numel() for p in model.parameters())}")

    args = TrainingArguments(
        output_dir=os.path.join(tmp, "clip-out"), per_device_train_batch_size=32,
        per_device_eval_batch_size=64, learning_rate=1e-3, warmup_steps=6, weight_decay=0.1,
        max_steps=40, lr_scheduler_type="cosine", eval_strategy="steps", eval_steps=10,
        logging_steps=5, remove_unused_columns=False, save_strategy="no", report_to=[],
        use_cpu=True, disable_tqdm=True, seed=0, dataloader_drop_last=True)
    trainer = Trainer(model=model, args=args, data_collator=collate_fn,
                      train_dataset=CaptionDataset(train_rows, tokenizer),
                      eval_dataset=CaptionDataset(eval_rows, tokenizer))
    print(f"zero-shot acc before: {zero_shot_accuracy(model, tokenizer, eval_rows):.3f}")
    trainer.train()
    metrics = trainer.evaluate()
    print(f"eval_loss {metrics['eval_loss']:.4f}  logit_scale {model.logit_scale.exp().item():.2f}")
    print(f"zero-shot acc after: {zero_shot_accuracy(model, tokenizer, eval_rows):.3f}")

    after = model.vision_model.state_dict()
    assert all(torch.equal(frozen_before[k], after[k]) for k in frozen_before), "vision tower moved"
    print("vision tower unchanged (frozen as intended)")


if __name__ == "__main__":
    main()
