"""Controlled text generation (Hu et al., 2017, "Toward Controlled Generation of Text"):
a GRU VAE is pre-trained, then the wake-sleep phase trains a sentiment discriminator,
the decoder (generator) and the encoder with three separate Adam optimizers.

Modelled on: wiseodd/controlled-text-generation ``train_vae.py`` + ``train_discriminator.py``
and its issue #27 "Is the gradient for Encoder doubled?": the generator loss ``loss_G``
(VAE loss plus the attribute losses) is back-propagated through the encoder, but only
``trainer_G.zero_grad()`` is called afterwards, so the encoder gradient left behind by
``loss_G`` is added to the gradient of ``loss_E`` before ``trainer_E.step()`` (the same
happens to the discriminator, whose gradient from ``loss_attr_c`` leaks into the next
``loss_D`` step).  The suggested fix is to clear those gradients (``trainer_E.zero_grad()``)
before the encoder / discriminator backward.

Unusual about the loop: three optimizers over disjoint parameter sets of one module, soft
(Gumbel-free, temperature-annealed) generated sentences fed to encoder and discriminator,
per-optimizer gradient clipping, a VAE warm-up phase with a KL weight schedule.
The main optimizer is ``trainer_E`` (encoder); it steps in both phases.
Run: python p01_ctextgen_shared_encoder_grads.py [--healthy]
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
VOCAB, SEQ, EMB, HID, ZDIM, CDIM = 40, 12, 32, 48, 16, 2
PAD, BOS = 0, 1
mb_size, lr = 32, 1e-3
vae_iters, wake_sleep_iters = 10, 30
lambda_c, lambda_z, lambda_u, beta, kl_weight_max = 0.1, 0.1, 0.1, 0.1, 0.4


class SentimentToyDataset:
    """Sentences over a 40-word vocabulary; positive/negative words depend on the label."""

    def __init__(self, n=2048):
        g = torch.Generator().manual_seed(1)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        neutral = torch.randint(10, VOCAB, (n, SEQ - 1), generator=g)
        polar = torch.randint(2, 6, (n, SEQ - 1), generator=g) + 4 * self.labels[:, None]
        use_polar = torch.rand(n, SEQ - 1, generator=g) < 0.35
        body = torch.where(use_polar, polar, neutral)
        self.data = torch.cat([torch.full((n, 1), BOS), body], 1)
        self.g = torch.Generator().manual_seed(2)

    def next_batch(self):
        idx = torch.randint(0, len(self.data), (mb_size,), generator=self.g)
        return self.data[idx].t().contiguous(), self.labels[idx]  # seq_len x mbsize


class RNN_VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.word_emb = nn.Embedding(VOCAB, EMB, padding_idx=PAD)
        self.encoder = nn.GRU(EMB, HID)
        self.q_mu, self.q_logvar = nn.Linear(HID, ZDIM), nn.Linear(HID, ZDIM)
        self.decoder = nn.GRU(EMB + ZDIM + CDIM, ZDIM + CDIM)
        self.decoder_fc = nn.Linear(ZDIM + CDIM, VOCAB)
        self.conv = nn.Conv1d(EMB, 32, 3, padding=1)
        self.disc_fc = nn.Sequential(nn.Dropout(0.2), nn.Linear(32, CDIM))
        self.encoder_params = (list(self.word_emb.parameters()) + list(self.encoder.parameters())
                               + list(self.q_mu.parameters()) + list(self.q_logvar.parameters()))
        self.decoder_params = list(self.decoder.parameters()) + list(self.decoder_fc.parameters())
        self.discriminator_params = list(self.conv.parameters()) + list(self.disc_fc.parameters())

    def forward_encoder_embed(self, emb):  # emb: seq x mb x EMB
        _, h = self.encoder(emb)
        h = h.squeeze(0)
        return self.q_mu(h), self.q_logvar(h)

    def forward_discriminator_embed(self, emb):  # emb: mb x seq x EMB
        h = F.relu(self.conv(emb.transpose(1, 2))).max(dim=2)[0]
        return self.disc_fc(h)

    def forward_discriminator(self, tokens):  # tokens: mb x seq
        return self.forward_discriminator_embed(self.word_emb(tokens))

    def sample_c_prior(self, n):
        return F.one_hot(torch.randint(0, CDIM, (n,)), CDIM).float()

    def forward_decoder(self, inputs, z, c):
        dec_in = F.dropout(self.word_emb(inputs), 0.3, self.training)
        zc = torch.cat([z, c], 1)
        seq_len = dec_in.size(0)
        out, _ = self.decoder(torch.cat([dec_in, zc.unsqueeze(0).expand(seq_len, -1, -1)], 2), zc.unsqueeze(0))
        logits = self.decoder_fc(out)
        return F.cross_entropy(logits[:-1].reshape(-1, VOCAB), inputs[1:].reshape(-1))

    def forward(self, inputs, use_c_prior=True):
        mu, logvar = self.forward_encoder_embed(self.word_emb(inputs))
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        if use_c_prior:
            c = self.sample_c_prior(inputs.size(1))
        else:
            c = F.softmax(self.forward_discriminator(inputs.t()), 1)
        kl = torch.mean(0.5 * torch.sum(torch.exp(logvar) + mu ** 2 - 1 - logvar, 1))
        return self.forward_decoder(inputs, z, c), kl

    def _unroll(self, z, c, temp, soft):
        zc = torch.cat([z, c], 1)
        h = zc.unsqueeze(0)
        word = self.word_emb(torch.full((z.size(0),), BOS, dtype=torch.long))
        outs = [word]
        for _ in range(SEQ - 1):
            o, h = self.decoder(torch.cat([word, zc], 1).unsqueeze(0), h)
            logits = self.decoder_fc(o.squeeze(0))
            if soft:
                word = F.softmax(logits / temp, 1) @ self.word_emb.weight
                outs.append(word)
            else:
                tok = torch.multinomial(F.softmax(logits, 1), 1).squeeze(1)
                word = self.word_emb(tok)
                outs.append(tok)
        return outs

    def generate_sentences(self, n):
        z, c = torch.randn(n, ZDIM), self.sample_c_prior(n)
        with torch.no_grad():
            toks = self._unroll(z, c, 1.0, soft=False)[1:]
        bos = torch.full((n, 1), BOS, dtype=torch.long)
        return torch.cat([bos, torch.stack(toks, 1)], 1), c

    def generate_soft_embed(self, n, temp):
        z, c = torch.randn(n, ZDIM), self.sample_c_prior(n)
        embs = self._unroll(z, c, temp, soft=True)
        return torch.stack(embs, 1), z, c.argmax(1)  # mb x seq x EMB


def kl_weight(it):
    return (math.tanh((it - 5) / 3) + 1) / 2


def temp(it):
    return 1 - 0.9 * min(1.0, it / wake_sleep_iters) + 1e-5


dataset = SentimentToyDataset()
model = RNN_VAE()
trainer_D = torch.optim.Adam(model.discriminator_params, lr=lr)
trainer_G = torch.optim.Adam(model.decoder_params, lr=lr)
trainer_E = torch.optim.Adam(model.encoder_params, lr=lr)

e_step = 0
max_leak = 0.0
# ---- phase 1: base VAE with c ~ p(c) (train_vae.py) ----
for it in range(vae_iters):
    inputs, _ = dataset.next_batch()
    recon_loss, kl_loss = model(inputs)
    loss = recon_loss + kl_weight(it) * kl_loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.encoder_params + model.decoder_params, 5)
    trainer_G.step(); trainer_E.step()
    trainer_G.zero_grad(); trainer_E.zero_grad()
    print(f"[vae] it {it} step {e_step} recon {recon_loss.item():.4f} kl {kl_loss.item():.4f}")
    e_step += 1

# ---- phase 2: wake-sleep (train_discriminator.py) ----
for it in range(wake_sleep_iters):
    inputs, labels = dataset.next_batch()
    # Update discriminator, eq. 11
    x_gen, c_gen = model.generate_sentences(mb_size)
    y_disc_real = model.forward_discriminator(inputs.t())
    y_disc_fake = model.forward_discriminator(x_gen)
    entropy = -F.log_softmax(y_disc_fake, 1).mean()
    loss_D = F.cross_entropy(y_disc_real, labels) + lambda_u * (F.cross_entropy(y_disc_fake, c_gen.argmax(1)) + beta * entropy)
    if args.healthy:
        trainer_D.zero_grad()
    loss_D.backward()
    torch.nn.utils.clip_grad_norm_(model.discriminator_params, 5)
    trainer_D.step(); trainer_D.zero_grad()

    # Update generator, eq. 8
    recon_loss, kl_loss = model(inputs, use_c_prior=False)
    x_gen_attr, target_z, target_c = model.generate_soft_embed(mb_size, temp(it))
    y_z, _ = model.forward_encoder_embed(x_gen_attr.transpose(0, 1))
    y_c = model.forward_discriminator_embed(x_gen_attr)
    loss_G = (recon_loss + kl_weight_max * kl_loss + lambda_c * F.cross_entropy(y_c, target_c)
              + lambda_z * F.mse_loss(y_z, target_z))
    loss_G.backward()
    torch.nn.utils.clip_grad_norm_(model.decoder_params, 5)
    trainer_G.step(); trainer_G.zero_grad()

    # Update encoder, eq. 4
    recon_loss, kl_loss = model(inputs, use_c_prior=False)
    loss_E = recon_loss + kl_weight_max * kl_loss
    pure = torch.autograd.grad(loss_E, model.encoder_params, retain_graph=True, allow_unused=True)
    if args.healthy:
        trainer_E.zero_grad()
    loss_E.backward()
    used = torch.cat([p.grad.flatten() for p in model.encoder_params])
    ref = torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(pure, model.encoder_params)])
    leak = ((used - ref).norm() / ref.norm()).item()
    max_leak = max(max_leak, leak)
    if not args.healthy and it == 0:
        print(f"ONSET step {e_step}")
    torch.nn.utils.clip_grad_norm_(model.encoder_params, 5)
    trainer_E.step(); trainer_E.zero_grad()
    print(f"[wake-sleep] it {it} step {e_step} loss_D {loss_D.item():.4f} loss_G {loss_G.item():.4f} loss_E {loss_E.item():.4f}")
    e_step += 1

print(f"EVIDENCE encoder grad at trainer_E.step vs grad of loss_E alone: max relative deviation {max_leak:.4f} "
      f"({'healthy' if args.healthy else 'buggy'})")
