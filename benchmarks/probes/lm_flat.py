"""Healthy probe: a character-level RNN language model whose forward returns (B*T, V) logits (char-rnn tutorials)."""
import torch
from torch import nn
torch.manual_seed(0)
class CharRNN(nn.Module):
    def __init__(self, vocab=30, hidden=32):
        super().__init__(); self.emb = nn.Embedding(vocab, hidden); self.rnn = nn.GRU(hidden, hidden, batch_first=True); self.fc = nn.Linear(hidden, vocab)
        self.hidden = hidden
    def forward(self, x):
        out, _ = self.rnn(self.emb(x))
        return self.fc(out.reshape(-1, self.hidden))   # (B*T, V) from (B, T)
model = CharRNN(); opt = torch.optim.Adam(model.parameters(), lr=3e-3)
for step in range(10):
    x = torch.randint(0, 30, (8, 12)); y = torch.randint(0, 30, (8 * 12,))
    opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
print("done")
