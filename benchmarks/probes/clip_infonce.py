"""Healthy probe: CLIP-style contrastive pre-training as in mlfoundations/open_clip (a ClipLoss module: logit_scale * image @ text.T, symmetric cross_entropy against arange(B) for both directions), a learnable temperature initialised to log(1 / 0.07) and clamped in place to log(100) after each step, AdamW without weight decay on gains, biases and logit_scale, warmup-cosine LambdaLR, zero-shot accuracy via softmax.

Loss-input edges: cross_entropy's input is a scaled similarity matrix (and its transpose, a
view), never probabilities; the softmax over the zero-shot logits is for accuracy only.
"""
import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, N_CONCEPTS = 50, 10


class TinyCLIP(nn.Module):
    def __init__(self, embed_dim=16):
        super().__init__()
        self.visual = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.GELU(), nn.Flatten(),
                                    nn.Linear(8 * 8 * 8, 32), nn.GELU(), nn.Linear(32, embed_dim))
        self.token_embedding = nn.EmbeddingBag(VOCAB, 32, mode="mean")
        self.ln_final = nn.LayerNorm(32)
        self.text_projection = nn.Linear(32, embed_dim, bias=False)
        self.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / 0.07))

    def encode_image(self, image):
        return F.normalize(self.visual(image), dim=-1)

    def encode_text(self, text):
        return F.normalize(self.text_projection(self.ln_final(self.token_embedding(text))), dim=-1)

    def forward(self, image, text):
        return self.encode_image(image), self.encode_text(text), self.logit_scale.exp()


class ClipLoss(nn.Module):
    def forward(self, image_features, text_features, logit_scale):
        logits_per_image = logit_scale * image_features @ text_features.T
        logits_per_text = logits_per_image.T
        labels = torch.arange(logits_per_image.shape[0], dtype=torch.long)
        return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2


def pairs(gen, prototypes, n=16):
    concept = torch.randint(0, N_CONCEPTS, (n,), generator=gen)
    images = prototypes[concept] + 0.3 * torch.randn(n, 3, 16, 16, generator=gen)
    words = (concept[:, None] * 5 + torch.randint(0, 5, (n, 4), generator=gen)) % VOCAB   # 4 tokens per caption
    return images, words, concept


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--wd", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    prototypes = torch.randn(N_CONCEPTS, 3, 16, 16, generator=gen)

    model, loss_fn = TinyCLIP(), ClipLoss()
    exclude = lambda n, p: p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or "logit_scale" in n  # noqa: E731
    named = list(model.named_parameters())
    optimizer = torch.optim.AdamW([
        {"params": [p for n, p in named if exclude(n, p)], "weight_decay": 0.0},
        {"params": [p for n, p in named if not exclude(n, p)], "weight_decay": args.wd},
    ], lr=args.lr, betas=(0.9, 0.98), eps=1e-6)
    cosine = lambda s: (s + 1) / args.warmup if s < args.warmup else \
        0.5 * (1 + math.cos(math.pi * (s - args.warmup) / max(1, args.steps - args.warmup)))  # noqa: E731
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)

    for step in range(args.steps):
        model.train()
        images, texts, _ = pairs(gen, prototypes)
        image_features, text_features, logit_scale = model(images, texts)
        total_loss = loss_fn(image_features, text_features, logit_scale)
        optimizer.zero_grad()
        total_loss.backward()
        optimizer.step()
        scheduler.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        print(f"step {step + 1} loss {total_loss.item():.3f} scale {logit_scale.item():.2f}")

    model.eval()
    with torch.no_grad():
        class_texts = torch.stack([(c * 5 + torch.arange(4)) % VOCAB for c in range(N_CONCEPTS)])
        classifier = model.encode_text(class_texts)
        images, _, concept = pairs(gen, prototypes, 40)
        text_probs = (100.0 * model.encode_image(images) @ classifier.T).softmax(dim=-1)
        print(f"zero-shot accuracy {(text_probs.argmax(-1) == concept).float().mean().item():.3f}")


if __name__ == "__main__":
    main()
