"""Healthy probe: a CTC speech recogniser in the style of deepspeech.pytorch / the AssemblyAI "end-to-end speech recognition in PyTorch" recipe: strided conv front end, bidirectional GRU over packed variable-length utterances, F.ctc_loss on time-major log_softmax with per-utterance input_lengths and concatenated targets, OneCycleLR, greedy decoding in eval.

Loss-input edges: ctc_loss receives log-probabilities (log_softmax then transpose(0, 1)), never
a softmax; the softmax is taken only at decode time, for frame confidences.
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

BLANK, N_CLASSES, N_MELS = 0, 12, 16


class SpeechRecognition(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.cnn = nn.Sequential(nn.Conv1d(N_MELS, hidden, kernel_size=3, stride=2, padding=1), nn.GELU())
        self.rnn = nn.GRU(hidden, hidden, batch_first=True, bidirectional=True)
        self.classifier = nn.Sequential(nn.LayerNorm(2 * hidden), nn.Dropout(0.1), nn.Linear(2 * hidden, N_CLASSES))

    @staticmethod
    def output_lengths(lengths):
        return (lengths + 2 - 3) // 2 + 1              # conv: padding 1, kernel 3, stride 2

    def forward(self, feats, lengths):               # feats (B, n_mels, T)
        x = self.cnn(feats).transpose(1, 2)           # (B, T', hidden)
        out_lengths = self.output_lengths(lengths)
        packed = pack_padded_sequence(x, out_lengths, batch_first=True, enforce_sorted=False)
        x, _ = self.rnn(packed)
        x, _ = pad_packed_sequence(x, batch_first=True)
        return self.classifier(x), out_lengths       # (B, T', classes)


def make_batch(gen, batch_size=8):
    lengths = torch.randint(20, 41, (batch_size,), generator=gen)
    feats = torch.zeros(batch_size, N_MELS, int(lengths.max()))
    targets, target_lengths = [], []
    for i, n in enumerate(lengths.tolist()):
        feats[i, :, :n] = torch.randn(N_MELS, n, generator=gen)
        k = int(torch.randint(2, 7, (1,), generator=gen))
        targets.append(torch.randint(1, N_CLASSES, (k,), generator=gen))
        target_lengths.append(k)
    return feats, lengths, torch.cat(targets), torch.tensor(target_lengths)


def greedy_decode(log_probs, lengths):
    best = log_probs.argmax(-1)
    decoded = []
    for seq, n in zip(best, lengths.tolist()):
        seq = torch.unique_consecutive(seq[:n])
        decoded.append([int(c) for c in seq if c != BLANK])
    return decoded


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = SpeechRecognition()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps,
                                                    anneal_strategy="linear")
    model.train()
    for step in range(args.steps):
        feats, lengths, targets, target_lengths = make_batch(gen)
        logits, input_lengths = model(feats, lengths)
        log_probs = F.log_softmax(logits, dim=2).transpose(0, 1)   # (T, B, C)
        loss = F.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=BLANK, zero_infinity=True)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        print(f"step {step + 1} ctc {loss.item():.3f}")

    model.eval()
    with torch.no_grad():
        feats, lengths, targets, target_lengths = make_batch(gen)
        logits, out_lengths = model(feats, lengths)
        log_probs = F.log_softmax(logits, dim=2)
        confidence = F.softmax(logits, dim=2).max(-1).values.mean()
        val = F.ctc_loss(log_probs.transpose(0, 1), targets, out_lengths, target_lengths, blank=BLANK,
                         zero_infinity=True)
        hyps = greedy_decode(log_probs, out_lengths)
    print(f"val ctc {val.item():.3f} confidence {confidence.item():.3f} first hypothesis {hyps[0]}")


if __name__ == "__main__":
    main()
