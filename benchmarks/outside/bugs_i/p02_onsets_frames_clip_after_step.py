"""Piano transcription (onsets & frames) on synthetic log-mel excerpts, with gradient clipping.

Modelled on: jongwook/onsets-and-frames#24 "Gradient clipping in the wrong place?" -- ``train.py``
calls ``clip_grad_norm_`` *after* ``loss.backward()`` *and* ``optimizer.step()``, so the clipping
never touches the gradients the optimizer used.  The author replied that it should sit between
backward and step, and that "in practice the gradient was well below the clip value during most
of the training" -- which is why the bug is silent until a batch with a large gradient arrives.

What is unusual about the loop: a velocity head trained with the masked MSE of the original, and
a data stream that occasionally contains a badly converted MIDI file whose velocities were scaled
with the wrong constant (a data-dependent event).  All early batches have gradient norms below the
clip value, so clipping only matters from the first such batch on.  A step pre-hook on the
optimizer records the gradient norm the optimizer actually consumes.  ``--healthy`` clips between
``backward()`` and ``optimizer.step()`` (the fix).
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)

N_MELS, N_KEYS, FRAMES = 48, 24, 64


def synth_batch(batch_size, raw_velocity, gen):
    """Random polyphonic piano rolls rendered to a log-mel-like spectrogram with harmonics."""
    roll = torch.zeros(batch_size, FRAMES, N_KEYS)
    onsets = torch.zeros_like(roll)
    velocity = torch.zeros_like(roll)
    for b in range(batch_size):
        for _ in range(int(torch.randint(3, 9, (1,), generator=gen))):
            k = int(torch.randint(0, N_KEYS, (1,), generator=gen))
            s = int(torch.randint(0, FRAMES - 8, (1,), generator=gen))
            d = int(torch.randint(4, 24, (1,), generator=gen))
            v = int(torch.randint(30, 120, (1,), generator=gen))
            roll[b, s:s + d, k] = 1.0
            onsets[b, s, k] = 1.0
            velocity[b, s, k] = v / 128.0
    if raw_velocity:  # half the batch is from a MIDI file converted with v / 32 instead of v / 128
        velocity[:4] = velocity[:4] * 4.0
    basis = torch.zeros(N_KEYS, N_MELS)
    for k in range(N_KEYS):
        for h, amp in ((1, 1.0), (2, 0.5), (3, 0.25)):
            m = min(N_MELS - 1, int(k * 1.5 * h ** 0.5) + 2)
            basis[k, m] += amp
    spec = roll @ basis + 0.6 * (onsets * velocity.clamp(max=1.0)) @ basis.roll(1, dims=1)
    spec = torch.log1p(4 * spec) + 0.05 * torch.randn(spec.shape, generator=gen)
    return spec, onsets, roll, velocity


class ConvStack(nn.Module):
    def __init__(self, out_features):
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.MaxPool2d((1, 2)),
        )
        self.fc = nn.Linear(8 * (N_MELS // 2), out_features)

    def forward(self, mel):
        x = self.cnn(mel.unsqueeze(1))  # B, C, T, F
        x = x.transpose(1, 2).flatten(2)
        return self.fc(x)


class OnsetsAndFrames(nn.Module):
    def __init__(self, model_size=32):
        super().__init__()
        self.onset_stack = ConvStack(model_size)
        self.onset_rnn = nn.GRU(model_size, model_size // 2, batch_first=True, bidirectional=True)
        self.onset_out = nn.Linear(model_size, N_KEYS)
        self.velocity_stack = ConvStack(model_size)
        self.velocity_out = nn.Linear(model_size, N_KEYS)
        nn.init.constant_(self.velocity_out.bias, 0.5)  # start at the mean velocity
        self.frame_stack = ConvStack(model_size)
        self.frame_out = nn.Linear(model_size, N_KEYS)
        self.combined_rnn = nn.GRU(2 * N_KEYS, model_size // 2, batch_first=True, bidirectional=True)
        self.combined_out = nn.Linear(model_size, N_KEYS)

    def forward(self, mel):
        onset_pred = self.onset_out(self.onset_rnn(self.onset_stack(mel))[0])
        activation = self.frame_out(self.frame_stack(mel))
        combined = torch.cat([torch.sigmoid(onset_pred).detach(), torch.sigmoid(activation)], -1)
        frame_pred = self.combined_out(self.combined_rnn(combined)[0])
        velocity_pred = self.velocity_out(self.velocity_stack(mel))
        return onset_pred, frame_pred, velocity_pred


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--learning-rate", type=float, default=6e-4)
    p.add_argument("--clip-gradient-norm", type=float, default=3.0)
    args = p.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    raw_vel_iters = {11, 19, 27, 33}  # where a badly converted MIDI file shows up in the stream

    model = OnsetsAndFrames()
    optimizer = torch.optim.Adam(model.parameters(), args.learning_rate)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.98)

    consumed = []  # grad norm actually seen by optimizer.step()

    def record_grad_norm(opt, *_):
        g = [p.grad.detach().flatten() for grp in opt.param_groups for p in grp["params"] if p.grad is not None]
        consumed.append(torch.cat(g).norm().item())

    optimizer.register_step_pre_hook(record_grad_norm)

    onset_reported = False
    for i in range(args.iterations):
        mel, onset_label, frame_label, velocity_label = synth_batch(args.batch_size, i in raw_vel_iters, gen)
        model.train()
        onset_pred, frame_pred, velocity_pred = model(mel)
        velocity_loss = (onset_label * (velocity_label - velocity_pred) ** 2).sum() / onset_label.sum()
        loss = (F.binary_cross_entropy_with_logits(onset_pred, onset_label)
                + F.binary_cross_entropy_with_logits(frame_pred, frame_label)
                + velocity_loss)

        optimizer.zero_grad()
        loss.backward()
        if args.healthy:
            total_norm = nn.utils.clip_grad_norm_(model.parameters(), args.clip_gradient_norm)
            optimizer.step()
        else:
            optimizer.step()
            total_norm = nn.utils.clip_grad_norm_(model.parameters(), args.clip_gradient_norm)
        scheduler.step()

        if not args.healthy and not onset_reported and total_norm > args.clip_gradient_norm:
            print(f"ONSET step {i}")
            onset_reported = True
        if i % 5 == 0 or i in raw_vel_iters:
            print(f"iter {i:3d} loss {loss.item():.4f} grad_norm {total_norm.item():.3f} "
                  f"consumed {consumed[-1]:.3f}")

    print(f"EVIDENCE max grad norm consumed by optimizer.step() {max(consumed):.3f} "
          f"(clip value {args.clip_gradient_norm})")


if __name__ == "__main__":
    main()
