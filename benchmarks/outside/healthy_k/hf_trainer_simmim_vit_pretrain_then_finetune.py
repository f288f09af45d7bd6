"""SimMIM masked-image-modelling pre-training of a small ViT with the HF Trainer,
followed by supervised fine-tuning of a classifier initialised from the MIM encoder.

Modelled on: huggingface/transformers ``examples/pytorch/image-pretraining/run_mim.py``
(its ``MaskGenerator``, the ``collate_fn`` returning ``pixel_values`` + ``bool_masked_pos``,
``AutoModelForMaskedImageModeling.from_config`` and the flags from ``mim.sh``:
``--remove_unused_columns False --label_names bool_masked_pos``), with the usual second
stage of SimMIM (Xie et al., 2022): fine-tune ``ViTForImageClassification`` from the
pre-trained encoder.

Data: synthetic 32x32 gratings under a per-image colour cast; the fine-tuning label is
the channel of the dominant cast.

What is unusual about the loop (all on purpose):
  * stage 1 has no labels; ``bool_masked_pos`` is declared as the "label" only so the
    Trainer computes an eval loss; the L1 loss covers masked patches only, and the
    ``mask_token`` parameter receives gradient only through masked positions;
  * masks are drawn on the fly per example (global numpy RNG) for training, while eval
    masks come from a per-index seeded generator so every evaluation sees the same masks;
  * a second model and a second Trainer/optimizer are built mid-program; the encoder is
    copied with ``strict=False`` (the MIM-only ``mask_token`` is expected as unexpected
    key, and the new classifier head is freshly initialised);
  * both stages warm up from lr 0; stage 2 evaluates every 8 steps (mid-epoch).
"""
import math
import tempfile

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import (Trainer, TrainingArguments, ViTConfig, ViTForImageClassification,
                          ViTForMaskedImageModeling, set_seed)

torch.set_num_threads(1)
set_seed(0)

IMAGE_SIZE, PATCH, MASK_PATCH, NUM_CLASSES = 32, 4, 8, 3


class MaskGenerator:
    """As in run_mim.py: random square mask patches, upsampled to model patches."""

    def __init__(self, input_size=32, mask_patch_size=8, model_patch_size=4, mask_ratio=0.6):
        self.rand_size = input_size // mask_patch_size
        self.scale = mask_patch_size // model_patch_size
        self.token_count = self.rand_size ** 2
        self.mask_count = int(np.ceil(self.token_count * mask_ratio))

    def __call__(self, rng=np.random):
        mask_idx = rng.permutation(self.token_count)[: self.mask_count]
        mask = np.zeros(self.token_count, dtype=int)
        mask[mask_idx] = 1
        mask = mask.reshape((self.rand_size, self.rand_size))
        mask = mask.repeat(self.scale, axis=0).repeat(self.scale, axis=1)
        return torch.tensor(mask.flatten())


def make_images(n, seed):
    """Synthetic photos: a random-orientation grating under a colour cast; the class is
    the channel of the dominant cast (a toy 'illuminant' label)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    yy, xx = torch.meshgrid(torch.arange(IMAGE_SIZE).float(), torch.arange(IMAGE_SIZE).float(), indexing="ij")
    imgs = []
    for lab in labels.tolist():
        a = math.pi * torch.rand(1, generator=g)
        freq = 0.5 + 0.3 * torch.rand(1, generator=g)
        phase = 2 * math.pi * torch.rand(1, generator=g)
        wave = torch.sin(freq * (xx * torch.cos(a) + yy * torch.sin(a)) + phase)
        cast = 0.5 * torch.randn(3, 1, 1, generator=g)
        cast[lab] += 0.8
        imgs.append(cast + wave + 0.05 * torch.randn(3, IMAGE_SIZE, IMAGE_SIZE, generator=g))
    return torch.stack(imgs), labels


class MIMDataset(Dataset):
    def __init__(self, images, mask_generator, fixed_masks=False, augment=False):
        self.images, self.mask_generator = images, mask_generator
        self.fixed_masks, self.augment = fixed_masks, augment

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        img = self.images[i]
        if self.augment and np.random.rand() < 0.5:
            img = img.flip(-1)  # RandomHorizontalFlip
        rng = np.random.RandomState(1000 + i) if self.fixed_masks else np.random
        return {"pixel_values": img, "mask": self.mask_generator(rng)}


class ClsDataset(Dataset):
    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return {"pixel_values": self.images[i], "labels": self.labels[i]}


def collate_fn(examples):
    pixel_values = torch.stack([example["pixel_values"] for example in examples])
    mask = torch.stack([example["mask"] for example in examples])
    return {"pixel_values": pixel_values, "bool_masked_pos": mask}


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


def main():
    train_x, train_y = make_images(384, seed=1)
    val_x, val_y = make_images(128, seed=2)
    mean = train_x.mean(dim=(0, 2, 3), keepdim=True)
    std = train_x.std(dim=(0, 2, 3), keepdim=True)
    train_x, val_x = (train_x - mean) / std, (val_x - mean) / std

    config = ViTConfig(image_size=IMAGE_SIZE, patch_size=PATCH, encoder_stride=PATCH, num_channels=3,
                       hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=128, num_labels=NUM_CLASSES)
    mim_model = ViTForMaskedImageModeling(config)
    mask_generator = MaskGenerator(IMAGE_SIZE, MASK_PATCH, PATCH, mask_ratio=0.6)

    with tempfile.TemporaryDirectory() as out_dir:
        common = dict(report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                      dataloader_num_workers=0, seed=0, logging_steps=8)
        pre_args = TrainingArguments(
            output_dir=f"{out_dir}/mim", remove_unused_columns=False, label_names=["bool_masked_pos"],
            per_device_train_batch_size=32, per_device_eval_batch_size=64, num_train_epochs=3,
            learning_rate=3e-3, weight_decay=0.05, warmup_steps=6, lr_scheduler_type="cosine",
            eval_strategy="epoch", **common)
        pre_trainer = Trainer(
            model=mim_model, args=pre_args,
            train_dataset=MIMDataset(train_x, mask_generator, augment=True),
            eval_dataset=MIMDataset(val_x, mask_generator, fixed_masks=True),
            data_collator=collate_fn)
        first_eval = pre_trainer.evaluate()["eval_loss"]
        pre_trainer.train()
        last_eval = pre_trainer.evaluate()["eval_loss"]
        print(f"[mim] masked-patch L1 on fixed eval masks: {first_eval:.4f} -> {last_eval:.4f}")

        # Stage 2: classifier initialised from the pre-trained encoder.
        clf = ViTForImageClassification(config)
        result = clf.vit.load_state_dict(mim_model.vit.state_dict(), strict=False)
        assert result.missing_keys == [], result.missing_keys
        assert result.unexpected_keys == ["embeddings.mask_token"], result.unexpected_keys
        assert torch.equal(clf.vit.encoder.layer[0].attention.attention.query.weight,
                           mim_model.vit.encoder.layer[0].attention.attention.query.weight)

        ft_args = TrainingArguments(
            output_dir=f"{out_dir}/ft", per_device_train_batch_size=32, per_device_eval_batch_size=64,
            max_steps=24, learning_rate=1e-3, weight_decay=0.05, warmup_ratio=0.1,
            lr_scheduler_type="linear", eval_strategy="steps", eval_steps=8, **common)
        ft_trainer = Trainer(model=clf, args=ft_args, train_dataset=ClsDataset(train_x, train_y),
                             eval_dataset=ClsDataset(val_x, val_y), compute_metrics=compute_metrics)
        ft_trainer.train()
        metrics = ft_trainer.evaluate()
        print(f"[finetune] eval loss {metrics['eval_loss']:.4f}  accuracy {metrics['eval_accuracy']:.3f}")


if __name__ == "__main__":
    main()
