"""Multi-speaker TTS fine-tuning with a Speaker Consistency Loss (SCL), as in YourTTS
(Casanova et al., 2022): a small VITS-like generator maps phonemes + a speaker embedding
straight to a waveform and is trained with a mel-spectrogram L1 loss; after the first
phase, the SCL (negative cosine similarity between the embeddings that a frozen speaker
encoder extracts from the generated and the ground-truth waveforms, weight alpha = 9) is
switched on to make the synthesised voice closer to the target speaker.

Modelled on: coqui-ai/TTS issue #2348 "[Bug] No grad in YourTTS speaker encoder": the speaker
encoder (``TTS/encoder/models/resnet.py``) computes its input spectrogram inside
``with torch.no_grad():``, so the embedding of the *generated* waveform has no autograd
history; ``loss_scl`` is added to the total loss, ``loss.backward()`` runs without error,
but the SCL contributes nothing to the generator's gradients.  The fix is to compute the
spectrogram of the generated audio with gradients enabled.  (The speaker encoder here is a
frozen, randomly initialised stand-in for the pre-trained H/ASP checkpoint.)

Unusual about the loop: a loss term that changes the objective partway (SCL from step 10),
a frozen auxiliary network in eval mode inside the training graph, STFT losses computed on
the fly, AdamW with betas (0.8, 0.99) and ExponentialLR, gradient clipping.
Run: python p08_yourtts_scl_speaker_encoder_no_grad.py [--healthy]
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

N_PHON, N_SPK, T_PHON, FRAMES_PER_PHON, HOP = 20, 4, 12, 4, 64
WAV_LEN = T_PHON * FRAMES_PER_PHON * HOP
SCL_START, STEPS, BATCH, SCL_ALPHA = 10, 32, 8, 9.0


def synth_dataset(n, g):
    """Ground-truth 'speech': phoneme-dependent formants, speaker-dependent pitch and timbre."""
    phon = torch.randint(0, N_PHON, (n, T_PHON), generator=g)
    spk = torch.randint(0, N_SPK, (n,), generator=g)
    f0 = torch.tensor([110.0, 150.0, 210.0, 260.0])[spk]
    timbre = torch.tensor([[1.0, 0.5, 0.2], [0.6, 1.0, 0.3], [0.3, 0.4, 1.0], [1.0, 0.1, 0.6]])[spk]
    formant = 1.0 + torch.linspace(0, 1.5, N_PHON)[phon].repeat_interleave(FRAMES_PER_PHON * HOP, 1)
    t = torch.arange(WAV_LEN).float() / 8000.0
    wav = sum(timbre[:, h:h + 1] * torch.sin(2 * math.pi * f0[:, None] * (h + 1) * formant * t) for h in range(3))
    env = 0.5 + 0.5 * torch.sin(math.pi * (torch.arange(WAV_LEN) % (FRAMES_PER_PHON * HOP)) / (FRAMES_PER_PHON * HOP))
    return phon, spk, 0.3 * wav * env


def log_mel(wav, n_fft=256):
    spec = torch.stft(wav, n_fft, hop_length=HOP, window=torch.hann_window(n_fft), return_complex=True).abs()
    return torch.log(spec + 1e-4)


class SpeakerEncoder(nn.Module):
    """Frozen speaker encoder with an internal spectrogram front end (use_torch_spec=True)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU())
        self.fc = nn.Linear(32, 64)

    def forward(self, x, l2_norm=True):
        if args.healthy:
            x = log_mel(x)
        else:
            with torch.no_grad():  # as in TTS/encoder/models/resnet.py
                x = log_mel(x)
        x = self.net(x.unsqueeze(1)).mean((2, 3))
        x = self.fc(x)
        return F.normalize(x, dim=1) if l2_norm else x


class Generator(nn.Module):
    def __init__(self, hid=64):
        super().__init__()
        self.phon_emb, self.spk_emb = nn.Embedding(N_PHON, hid), nn.Embedding(N_SPK, hid)
        self.enc = nn.Sequential(nn.Conv1d(hid, hid, 3, padding=1), nn.LeakyReLU(0.1), nn.Conv1d(hid, hid, 3, padding=1))
        self.up = nn.Sequential(nn.ConvTranspose1d(hid, 32, 16, stride=8, padding=4), nn.LeakyReLU(0.1),
                                nn.ConvTranspose1d(32, 16, 16, stride=8, padding=4), nn.LeakyReLU(0.1),
                                nn.Conv1d(16, 1, 7, padding=3))

    def forward(self, phon, spk):
        h = (self.phon_emb(phon) + self.spk_emb(spk)[:, None]).transpose(1, 2)
        h = self.enc(h.repeat_interleave(FRAMES_PER_PHON, 2)) + self.spk_emb(spk)[:, :, None]
        return torch.tanh(self.up(h)).squeeze(1)


g = torch.Generator().manual_seed(1)
phon_all, spk_all, wav_all = synth_dataset(256, g)
speaker_encoder = SpeakerEncoder().eval()
for p in speaker_encoder.parameters():
    p.requires_grad_(False)
net_g = Generator()
optim_g = torch.optim.AdamW(net_g.parameters(), lr=2e-3, betas=(0.8, 0.99), eps=1e-9)
scheduler_g = torch.optim.lr_scheduler.ExponentialLR(optim_g, gamma=0.98)
params = list(net_g.parameters())
order = torch.Generator().manual_seed(2)

scl_grad_norms, sims = [], []
for step in range(STEPS):
    idx = torch.randint(0, len(wav_all), (BATCH,), generator=order)
    phon, spk, y = phon_all[idx], spk_all[idx], wav_all[idx]
    y_hat = net_g(phon, spk)
    loss_mel = F.l1_loss(log_mel(y_hat), log_mel(y)) * 45.0 / 10.0
    loss = loss_mel
    use_scl = step >= SCL_START
    if use_scl:
        if step == SCL_START and not args.healthy:
            print(f"ONSET step {step}")
        emb_gen, emb_gt = speaker_encoder(y_hat), speaker_encoder(y)
        loss_scl = -F.cosine_similarity(emb_gen, emb_gt).mean() * SCL_ALPHA
        loss = loss + loss_scl
        g_mel = torch.autograd.grad(loss_mel, params, retain_graph=True)
    optim_g.zero_grad()
    loss.backward()
    if use_scl:
        scl_part = torch.sqrt(sum(((p.grad - gm) ** 2).sum() for p, gm in zip(params, g_mel))).item()
        scl_grad_norms.append(scl_part)
        sims.append(-loss_scl.item() / SCL_ALPHA)
    gnorm = torch.nn.utils.clip_grad_norm_(params, 10.0)
    optim_g.step()
    if step % 8 == 7:
        scheduler_g.step()
    extra = f" scl {loss_scl.item():.4f} scl_grad_norm {scl_grad_norms[-1]:.4f}" if use_scl else ""
    print(f"step {step} mel_l1 {loss_mel.item():.4f} grad_norm {gnorm:.3f}{extra}")

print(f"EVIDENCE norm of the generator gradient coming from the SCL term: mean {sum(scl_grad_norms) / len(scl_grad_norms):.4f} "
      f"(max {max(scl_grad_norms):.4f}); speaker cosine similarity first/last SCL step {sims[0]:.4f}/{sims[-1]:.4f}")
