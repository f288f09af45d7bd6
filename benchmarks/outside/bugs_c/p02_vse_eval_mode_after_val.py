"""P02 (class: model left in eval() mode after a mid-epoch validation -- dropout and BatchNorm switched off
for the rest of the epoch) -- plain PyTorch loop.

Modelled on fartashf/vsepp#4 "Finish validation without running model.train()": VSE++'s train.py calls
`validate()` every `opt.val_step` iterations, and validate() calls `model.val_start()` (eval mode for the image
and text encoders), but `model.train_start()` is only called at the start of the next epoch, so after each
mid-epoch validation the encoders train with dropout off and BatchNorm normalising with running statistics
(and no longer updating them).  The maintainer confirmed the effect on results was non-negligible.

This is a small VSE++-style image-caption embedding model (CNN image encoder with BatchNorm + dropout, GRU text
encoder, hinge-based triplet loss with hardest negatives, grad clipping, step LR decay, best-rsum checkpoint)
on synthetic paired data.  2 epochs x 16 iterations, val_step=12: validation after step 11 leaves the model in
eval mode for steps 12-15 (and again for 24-31 after the next mid-epoch validation).  Healthy twin: validate()
is followed by model.train_start(), as in the fix.
"""
import argparse
import shutil
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
parser.add_argument("--num_epochs", type=int, default=2)
parser.add_argument("--iters_per_epoch", type=int, default=16)
parser.add_argument("--batch_size", type=int, default=32)
parser.add_argument("--val_step", type=int, default=12)
parser.add_argument("--learning_rate", type=float, default=2e-3)
parser.add_argument("--lr_update", type=int, default=1)
parser.add_argument("--margin", type=float, default=0.2)
parser.add_argument("--grad_clip", type=float, default=2.0)
parser.add_argument("--embed_size", type=int, default=64)
parser.add_argument("--vocab_size", type=int, default=60)
parser.add_argument("--max_violation", action="store_true", default=True)
opt = parser.parse_args()
HEALTHY = opt.healthy
torch.manual_seed(0)

# ---------------- synthetic paired data ----------------
N_CONCEPTS = 10
g0 = torch.Generator().manual_seed(2024)
img_templates = F.interpolate(torch.randn(N_CONCEPTS, 3, 4, 4, generator=g0), size=16, mode="bilinear",
                              align_corners=False)
word_logits = 3.0 * torch.randn(N_CONCEPTS, opt.vocab_size, generator=g0)


def make_batch(bs, g):
    c = torch.randint(0, N_CONCEPTS, (bs,), generator=g)
    mix = torch.rand(bs, 1, 1, 1, generator=g)
    c2 = torch.randint(0, N_CONCEPTS, (bs,), generator=g)
    images = img_templates[c] + 0.5 * mix * img_templates[c2] + 0.8 * torch.randn(bs, 3, 16, 16, generator=g)
    lengths = torch.randint(5, 11, (bs,), generator=g)
    caps = torch.zeros(bs, 10, dtype=torch.long)
    probs = F.softmax(word_logits[c], dim=-1)
    for i in range(bs):
        caps[i, :lengths[i]] = torch.multinomial(probs[i], int(lengths[i]), replacement=True, generator=g) + 1
    return images, caps, lengths


val_gen = torch.Generator().manual_seed(77)
val_loader = [make_batch(50, val_gen) for _ in range(2)]


def l2norm(x):
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-8)


class EncoderImageFull(nn.Module):
    def __init__(self, embed_size):
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(True), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.3))
        self.fc = nn.Linear(64, embed_size)

    def forward(self, images):
        return l2norm(self.fc(self.cnn(images)))


class EncoderText(nn.Module):
    def __init__(self, vocab_size, word_dim, embed_size):
        super().__init__()
        self.embed = nn.Embedding(vocab_size + 1, word_dim, padding_idx=0)
        self.drop = nn.Dropout(0.3)
        self.rnn = nn.GRU(word_dim, embed_size, batch_first=True)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(self.drop(self.embed(x)), lengths, batch_first=True,
                                                   enforce_sorted=False)
        _, h = self.rnn(packed)
        return l2norm(h[-1])


class ContrastiveLoss(nn.Module):
    def __init__(self, margin=0.0, max_violation=False):
        super().__init__()
        self.margin, self.max_violation = margin, max_violation

    def forward(self, im, s):
        scores = im @ s.t()
        diagonal = scores.diag().view(im.size(0), 1)
        cost_s = (self.margin + scores - diagonal.expand_as(scores)).clamp(min=0)
        cost_im = (self.margin + scores - diagonal.t().expand_as(scores)).clamp(min=0)
        mask = torch.eye(scores.size(0), dtype=torch.bool)
        cost_s, cost_im = cost_s.masked_fill(mask, 0), cost_im.masked_fill(mask, 0)
        if self.max_violation:
            cost_s, cost_im = cost_s.max(1)[0], cost_im.max(0)[0]
        return cost_s.sum() + cost_im.sum()


class VSE:
    def __init__(self, opt):
        self.grad_clip = opt.grad_clip
        self.img_enc = EncoderImageFull(opt.embed_size)
        self.txt_enc = EncoderText(opt.vocab_size, 32, opt.embed_size)
        self.criterion = ContrastiveLoss(opt.margin, opt.max_violation)
        self.params = list(self.txt_enc.parameters()) + list(self.img_enc.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=opt.learning_rate)
        self.Eiters = 0

    def state_dict(self):
        return [self.img_enc.state_dict(), self.txt_enc.state_dict()]

    def train_start(self):
        self.img_enc.train()
        self.txt_enc.train()

    def val_start(self):
        self.img_enc.eval()
        self.txt_enc.eval()

    def forward_emb(self, images, captions, lengths):
        return self.img_enc(images), self.txt_enc(captions, lengths)

    def train_emb(self, images, captions, lengths):
        self.Eiters += 1
        img_emb, cap_emb = self.forward_emb(images, captions, lengths)
        self.optimizer.zero_grad()
        loss = self.criterion(img_emb, cap_emb)
        loss.backward()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.optimizer.step()
        return loss.item()


@torch.no_grad()
def encode_data(model, loader):
    ims, caps = [], []
    for images, captions, lengths in loader:
        a, b = model.forward_emb(images, captions, lengths)
        ims.append(a)
        caps.append(b)
    return torch.cat(ims), torch.cat(caps)


def recall(sims, ks=(1, 5)):
    ranks = (sims > sims.diag().unsqueeze(1)).sum(1)
    return [100.0 * (ranks < k).float().mean().item() for k in ks]


def validate(opt, val_loader, model):
    model.val_start()
    img_embs, cap_embs = encode_data(model, val_loader)
    sims = img_embs @ cap_embs.t()
    r1, r5 = recall(sims)
    r1i, r5i = recall(sims.t())
    rsum = r1 + r5 + r1i + r5i
    print(f"  validate @Eiters {model.Eiters}: i2t R@1 {r1:.1f} R@5 {r5:.1f} | t2i R@1 {r1i:.1f} R@5 {r5i:.1f} "
          f"| rsum {rsum:.1f}")
    return rsum


def adjust_learning_rate(opt, optimizer, epoch):
    lr = opt.learning_rate * (0.1 ** (epoch // opt.lr_update))
    for group in optimizer.param_groups:
        group["lr"] = lr


train_gen = torch.Generator().manual_seed(5)
onset_reported = False


def train(opt, model, epoch):
    global onset_reported
    model.train_start()
    for i in range(opt.iters_per_epoch):
        images, captions, lengths = make_batch(opt.batch_size, train_gen)
        step = model.Eiters  # 0-based optimizer step about to run
        if not HEALTHY and not onset_reported and not model.img_enc.training:
            print(f"ONSET step {step}")  # encoders still in eval mode from the last validate()
            onset_reported = True
        loss = model.train_emb(images, captions, lengths)
        if step % 4 == 0:
            print(f"Epoch [{epoch}][{i}/{opt.iters_per_epoch}] step {step} loss {loss:.4f}")
        if model.Eiters % opt.val_step == 0:
            validate(opt, val_loader, model)
            if HEALTHY:
                model.train_start()  # the fix: go back to training mode after mid-epoch validation


model = VSE(opt)
best_rsum = 0
for epoch in range(opt.num_epochs):
    adjust_learning_rate(opt, model.optimizer, epoch)
    train(opt, model, epoch)
    rsum = validate(opt, val_loader, model)
    is_best = rsum > best_rsum
    best_rsum = max(rsum, best_rsum)
    torch.save({"epoch": epoch + 1, "model": model.state_dict(), "best_rsum": best_rsum,
                "Eiters": model.Eiters}, "p02_checkpoint.pth.tar")
    if is_best:
        shutil.copyfile("p02_checkpoint.pth.tar", "p02_model_best.pth.tar")
print(f"done: {model.Eiters} optimizer steps, best rsum {best_rsum:.1f}")
