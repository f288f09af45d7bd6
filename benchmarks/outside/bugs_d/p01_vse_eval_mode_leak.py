"""P01 (class: dropout/BatchNorm left in eval mode after a mid-epoch validation) -- plain loop.

Modelled on fartashf/vsepp#4 "Finish validation without running model.train()": VSE++
(train.py) runs `validate()` every `val_step` iterations *inside* the epoch; validate()
calls `model.val_start()` (eval mode for both encoders) but nothing switches the encoders
back until `model.train_start()` at the start of the next epoch, so BatchNorm in the image
encoder and dropout in the text encoder run in inference mode for the rest of the epoch
(the maintainer confirmed non-negligible changes in the results).

This is a small image-text embedding trained with the VSE++ max-violation hinge loss.
The epoch here is longer than the run, and the first validation happens after
iteration 12, so from optimizer step 12 on training silently runs in eval mode.
Healthy twin: `model.train_start()` is called again right after validation (the fix).
"""
import sys, time
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import Dataset, DataLoader

HEALTHY = "--healthy" in sys.argv
torch.set_num_threads(1)
torch.manual_seed(0)


class Opt:
    vocab_size = 200
    word_dim = 32
    embed_size = 64
    img_dim = 96
    margin = 0.2
    max_violation = True
    grad_clip = 2.0
    learning_rate = 2e-3
    batch_size = 64
    num_epochs = 1           # the real recipe uses 30 epochs; a short run here
    val_step = 12
    log_step = 4
    seq_len = 10


opt = Opt()


# ---------------------------------------------------------------- synthetic "COCO" ----
class PrecompDataset(Dataset):
    """Pre-computed image features + captions generated from a shared latent concept."""

    def __init__(self, n, g, A, W):
        z = torch.randn(n, 16, generator=g)
        self.images = torch.tanh(z @ A) + 0.1 * torch.randn(n, opt.img_dim, generator=g)
        logits = (z @ W).unsqueeze(1).expand(n, opt.seq_len, opt.vocab_size)
        gumbel = -torch.log(-torch.log(torch.rand(n, opt.seq_len, opt.vocab_size, generator=g)))
        self.captions = (logits + 1.0 * gumbel).argmax(-1)
        self.lengths = torch.randint(6, opt.seq_len + 1, (n,), generator=g)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.captions[i], int(self.lengths[i]), i


def collate_fn(data):
    data.sort(key=lambda x: x[2], reverse=True)     # packed sequences need sorted lengths
    images, captions, lengths, ids = zip(*data)
    return torch.stack(images), torch.stack(captions), list(lengths), list(ids)


gen = torch.Generator().manual_seed(1234)
A_img = torch.randn(16, opt.img_dim, generator=gen) / 4      # "visual" view of the latent concept
W_txt = torch.randn(16, opt.vocab_size, generator=gen)       # word distribution of the concept
train_set = PrecompDataset(36 * opt.batch_size, gen, A_img, W_txt)
val_set = PrecompDataset(320, gen, A_img, W_txt)
train_loader = DataLoader(train_set, batch_size=opt.batch_size, shuffle=True, collate_fn=collate_fn,
                          generator=torch.Generator().manual_seed(7))
val_loader = DataLoader(val_set, batch_size=128, shuffle=False, collate_fn=collate_fn)


# ---------------------------------------------------------------------------- model ----
def l2norm(x):
    return x / x.pow(2).sum(dim=1, keepdim=True).sqrt().clamp_min(1e-8)


class EncoderImagePrecomp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(opt.img_dim, 128)
        self.bn = nn.BatchNorm1d(128)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(128, opt.embed_size)

    def forward(self, images):
        h = self.drop(F.relu(self.bn(self.fc1(images))))
        return l2norm(self.fc2(h))


class EncoderText(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(opt.vocab_size, opt.word_dim)
        self.drop = nn.Dropout(0.3)
        self.rnn = nn.GRU(opt.word_dim, opt.embed_size, 1, batch_first=True)

    def forward(self, x, lengths):
        x = self.drop(self.embed(x))
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
        out, _ = self.rnn(packed)
        padded = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        I = torch.LongTensor(lengths).view(-1, 1, 1).expand(x.size(0), 1, opt.embed_size) - 1
        return l2norm(torch.gather(padded[0], 1, I).squeeze(1))


class ContrastiveLoss(nn.Module):
    def __init__(self, margin=0, max_violation=False):
        super().__init__()
        self.margin, self.max_violation = margin, max_violation

    def forward(self, im, s):
        scores = im @ s.t()
        diagonal = scores.diag().view(im.size(0), 1)
        cost_s = (self.margin + scores - diagonal.expand_as(scores)).clamp(min=0)
        cost_im = (self.margin + scores - diagonal.t().expand_as(scores)).clamp(min=0)
        mask = torch.eye(scores.size(0)) > .5
        cost_s = cost_s.masked_fill_(mask, 0)
        cost_im = cost_im.masked_fill_(mask, 0)
        if self.max_violation:
            cost_s = cost_s.max(1)[0]
            cost_im = cost_im.max(0)[0]
        return cost_s.sum() + cost_im.sum()


class VSE(object):
    def __init__(self):
        self.img_enc = EncoderImagePrecomp()
        self.txt_enc = EncoderText()
        self.criterion = ContrastiveLoss(margin=opt.margin, max_violation=opt.max_violation)
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

    def train_emb(self, images, captions, lengths, ids=None):
        self.Eiters += 1
        img_emb, cap_emb = self.forward_emb(images, captions, lengths)
        self.optimizer.zero_grad()
        loss = self.criterion(img_emb, cap_emb)
        loss.backward()
        if opt.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, opt.grad_clip)
        self.optimizer.step()
        return loss.item()


# ----------------------------------------------------------------------- evaluation ----
def encode_data(model, data_loader):
    img_embs, cap_embs = torch.zeros(len(data_loader.dataset), opt.embed_size), torch.zeros(
        len(data_loader.dataset), opt.embed_size)
    with torch.no_grad():
        for images, captions, lengths, ids in data_loader:
            img_emb, cap_emb = model.forward_emb(images, captions, lengths)
            img_embs[ids] = img_emb
            cap_embs[ids] = cap_emb
    return img_embs, cap_embs


def recall_at_k(sims, k):
    ranks = (sims > sims.diag().unsqueeze(1)).sum(1)
    return 100.0 * (ranks < k).float().mean().item()


def validate(val_loader, model):
    model.val_start()
    img_embs, cap_embs = encode_data(model, val_loader)
    sims = img_embs @ cap_embs.t()
    r1, r5 = recall_at_k(sims, 1), recall_at_k(sims, 5)
    r1i, r5i = recall_at_k(sims.t(), 1), recall_at_k(sims.t(), 5)
    rsum = r1 + r5 + r1i + r5i
    print(f"  [val] Eiters {model.Eiters}: i2t R@1 {r1:.1f} R@5 {r5:.1f} | t2i R@1 {r1i:.1f} R@5 {r5i:.1f} | rsum {rsum:.1f}")
    return rsum


# ---------------------------------------------------------------------------- main ----
def train(train_loader, model, epoch, val_loader, best_rsum, onset_printed):
    model.train_start()
    for i, (images, captions, lengths, ids) in enumerate(train_loader):
        step = model.Eiters                     # 0-based index of the optimizer step about to run
        if not HEALTHY and not onset_printed and not model.img_enc.training:
            print("ONSET step", step)
            onset_printed = True
        loss = model.train_emb(images, captions, lengths, ids)
        if model.Eiters % opt.log_step == 0:
            print(f"Epoch [{epoch}][{i}/{len(train_loader)}] Eit {model.Eiters} Le {loss:.4f}")
        if model.Eiters % opt.val_step == 0:
            rsum = validate(val_loader, model)
            best_rsum = max(rsum, best_rsum)
            if HEALTHY:
                model.train_start()             # the fix: go back to training mode
    return best_rsum, onset_printed


def main():
    t0 = time.time()
    model = VSE()
    best_rsum, onset_printed = 0, False
    for epoch in range(opt.num_epochs):
        best_rsum, onset_printed = train(train_loader, model, epoch, val_loader, best_rsum, onset_printed)
        rsum = validate(val_loader, model)
        best_rsum = max(rsum, best_rsum)
    print(f"done: {model.Eiters} iterations, best rsum {best_rsum:.1f}, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
