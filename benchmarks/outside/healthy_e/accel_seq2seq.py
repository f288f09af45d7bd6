"""GRU encoder-decoder with Bahdanau attention, trained with 🤗 Accelerate and gradient accumulation.

Modelled on the PyTorch tutorial "NLP From Scratch: Translation with a Sequence
to Sequence Network and Attention" (``intermediate/seq2seq_translation_tutorial``):
``EncoderRNN`` (embedding + GRU), ``AttnDecoderRNN`` with ``BahdanauAttention``,
teacher forcing during training, greedy decoding for evaluation, ``NLLLoss`` on
log-probabilities, and -- as in the tutorial -- two separate models with two
separate optimizers (``encoder_optimizer`` / ``decoder_optimizer``).

The loop is ported to Accelerate in the style of accelerate's
``examples/by_feature/gradient_accumulation.py``: ``Accelerator(cpu=True,
gradient_accumulation_steps=2)``, everything passed through
``accelerator.prepare``, the step wrapped in ``with accelerator.accumulate(encoder,
decoder):`` (prepared optimizers only really step/zero on sync steps),
``accelerator.backward`` and ``accelerator.clip_grad_norm_`` on sync steps.
Evaluation runs in ``eval()`` mode under ``torch.no_grad()``.

The "language pair" is synthetic: the target is the source reversed and passed
through a fixed word dictionary.  640 pairs, batch 32, accumulation 2, 6 epochs
= 60 optimizer steps per optimizer.
"""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true", help="ignored")
args = parser.parse_args()

torch.set_num_threads(1)

SOS_token, EOS_token, PAD_token = 0, 1, 2
FIRST_WORD, VOCAB = 3, 20
MAX_LENGTH = 8  # longest sentence (6 words) + EOS, padded
DICTIONARY = np.random.default_rng(5).permutation(np.arange(FIRST_WORD, VOCAB))


def make_pairs(n, seed):
    rng = np.random.default_rng(seed)
    src = np.full((n, MAX_LENGTH), PAD_token)
    tgt = np.full((n, MAX_LENGTH), PAD_token)
    for i in range(n):
        length = int(rng.integers(3, 7))
        words = rng.integers(FIRST_WORD, VOCAB, size=length)
        src[i, :length], src[i, length] = words, EOS_token
        tgt[i, :length], tgt[i, length] = DICTIONARY[words[::-1] - FIRST_WORD], EOS_token
    return TensorDataset(torch.from_numpy(src), torch.from_numpy(tgt))


class EncoderRNN(nn.Module):
    def __init__(self, input_size, hidden_size, dropout_p=0.1):
        super().__init__()
        self.embedding = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, input):
        embedded = self.dropout(self.embedding(input))
        output, hidden = self.gru(embedded)
        return output, hidden


class BahdanauAttention(nn.Module):
    def __init__(self, hidden_size):
        super().__init__()
        self.Wa = nn.Linear(hidden_size, hidden_size)
        self.Ua = nn.Linear(hidden_size, hidden_size)
        self.Va = nn.Linear(hidden_size, 1)

    def forward(self, query, keys):
        scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys)))
        scores = scores.squeeze(2).unsqueeze(1)
        weights = F.softmax(scores, dim=-1)
        context = torch.bmm(weights, keys)
        return context, weights


class AttnDecoderRNN(nn.Module):
    def __init__(self, hidden_size, output_size, dropout_p=0.1):
        super().__init__()
        self.embedding = nn.Embedding(output_size, hidden_size)
        self.attention = BahdanauAttention(hidden_size)
        self.gru = nn.GRU(2 * hidden_size, hidden_size, batch_first=True)
        self.out = nn.Linear(hidden_size, output_size)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, encoder_outputs, encoder_hidden, target_tensor=None):
        batch_size = encoder_outputs.size(0)
        decoder_input = torch.full((batch_size, 1), SOS_token, dtype=torch.long, device=encoder_outputs.device)
        decoder_hidden = encoder_hidden
        decoder_outputs = []
        for i in range(MAX_LENGTH):
            decoder_output, decoder_hidden = self.forward_step(decoder_input, decoder_hidden, encoder_outputs)
            decoder_outputs.append(decoder_output)
            if target_tensor is not None:
                decoder_input = target_tensor[:, i].unsqueeze(1)  # teacher forcing
            else:
                _, topi = decoder_output.topk(1)
                decoder_input = topi.squeeze(-1).detach()  # detach from history as input
        decoder_outputs = torch.cat(decoder_outputs, dim=1)
        return F.log_softmax(decoder_outputs, dim=-1), decoder_hidden

    def forward_step(self, input, hidden, encoder_outputs):
        embedded = self.dropout(self.embedding(input))
        query = hidden.permute(1, 0, 2)
        context, _ = self.attention(query, encoder_outputs)
        output, hidden = self.gru(torch.cat((embedded, context), dim=2), hidden)
        return self.out(output), hidden


def evaluate(encoder, decoder, loader, accelerator):
    encoder.eval()
    decoder.eval()
    seq_correct, tok_correct, tok_total = 0, 0, 0
    with torch.no_grad():
        for src, tgt in loader:
            encoder_outputs, encoder_hidden = encoder(src)
            decoder_outputs, _ = decoder(encoder_outputs, encoder_hidden)
            pred = decoder_outputs.argmax(-1)
            pred, tgt = accelerator.gather_for_metrics((pred, tgt))
            mask = tgt != PAD_token
            tok_correct += ((pred == tgt) & mask).sum().item()
            tok_total += mask.sum().item()
            seq_correct += ((pred == tgt) | ~mask).all(dim=1).sum().item()
    encoder.train()
    decoder.train()
    return tok_correct / tok_total, seq_correct / len(loader.dataset)


def main():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    set_seed(17)
    hidden_size = 64
    encoder = EncoderRNN(VOCAB, hidden_size)
    decoder = AttnDecoderRNN(hidden_size, VOCAB)
    encoder_optimizer = torch.optim.Adam(encoder.parameters(), lr=3e-3)
    decoder_optimizer = torch.optim.Adam(decoder.parameters(), lr=3e-3)
    criterion = nn.NLLLoss(ignore_index=PAD_token)
    train_loader = DataLoader(make_pairs(640, seed=1), batch_size=32, shuffle=True)
    eval_loader = DataLoader(make_pairs(200, seed=2), batch_size=100)

    encoder, decoder, encoder_optimizer, decoder_optimizer, train_loader, eval_loader = accelerator.prepare(
        encoder, decoder, encoder_optimizer, decoder_optimizer, train_loader, eval_loader)

    tok_acc, seq_acc = evaluate(encoder, decoder, eval_loader, accelerator)
    accelerator.print(f"before training: token_acc {tok_acc:.3f} sentence_acc {seq_acc:.3f}")
    optimizer_steps = 0
    for epoch in range(1, 7):
        total_loss = 0.0
        for src, tgt in train_loader:
            with accelerator.accumulate(encoder, decoder):
                encoder_outputs, encoder_hidden = encoder(src)
                decoder_outputs, _ = decoder(encoder_outputs, encoder_hidden, tgt)
                loss = criterion(decoder_outputs.view(-1, decoder_outputs.size(-1)), tgt.view(-1))
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(encoder.parameters(), 1.0)
                    accelerator.clip_grad_norm_(decoder.parameters(), 1.0)
                    optimizer_steps += 1
                encoder_optimizer.step()
                decoder_optimizer.step()
                encoder_optimizer.zero_grad()
                decoder_optimizer.zero_grad()
            total_loss += loss.item()
        tok_acc, seq_acc = evaluate(encoder, decoder, eval_loader, accelerator)
        accelerator.print(f"epoch {epoch} optimizer_steps {optimizer_steps} train_loss "
                          f"{total_loss / len(train_loader):.4f} eval token_acc {tok_acc:.3f} sentence_acc {seq_acc:.3f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
