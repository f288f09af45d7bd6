"""Modelled on the PyTorch tutorial 'Text classification with the torchtext library'
(TextClassificationModel: nn.EmbeddingBag + Linear fed with (text, offsets), SGD lr=5 with
StepLR(1, gamma=0.1), clip_grad_norm_(0.1), evaluate() each epoch) — but with a frozen
'pretrained' embedding (nn.EmbeddingBag.from_pretrained(freeze=True), as in GloVe-feature recipes)
and an MLP encoder compiled alone with torch.compile(submodule) as the 'Introduction to
torch.compile' tutorial shows for modules; mid-epoch validation under model.eval() +
torch.inference_mode()."""
import torch, torch.nn as nn
torch.manual_seed(0)
V, E, NC = 500, 32, 4
pretrained = torch.randn(V, E)
topic_words = [torch.arange(c * 50, c * 50 + 50) for c in range(NC)]
def make(n):
    texts, labels = [], []
    for _ in range(n):
        c = int(torch.randint(0, NC, (1,))); ln = int(torch.randint(5, 15, (1,)))
        t = torch.randint(200, V, (ln,)); k = max(2, ln // 3); t[:k] = topic_words[c][torch.randint(0, 50, (k,))]
        texts.append(t); labels.append(c)
    return texts, torch.tensor(labels)
def collate(texts, labels):
    offsets = torch.tensor([0] + [len(t) for t in texts[:-1]]).cumsum(0)
    return torch.cat(texts), offsets, labels
class TextClassificationModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.EmbeddingBag.from_pretrained(pretrained, freeze=True, mode="mean")
        self.encoder = nn.Sequential(nn.Linear(E, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.fc = nn.Linear(64, NC)
    def forward(self, text, offsets): return self.fc(self.encoder(self.embedding(text, offsets)))
model = TextClassificationModel()
model.encoder = torch.compile(model.encoder)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(filter(lambda p: p.requires_grad, model.parameters()), lr=5.0)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
tr_t, tr_y = make(640); va_t, va_y = make(128)
def evaluate():
    model.eval()
    with torch.inference_mode():
        text, off, lab = collate(va_t, va_y); acc = (model(text, off).argmax(1) == lab).float().mean().item()
    model.train(); return acc
for epoch in range(3):
    model.train(); perm = torch.randperm(len(tr_t))
    for i in range(0, len(tr_t), 48):
        b = perm[i:i + 48]; text, off, lab = collate([tr_t[j] for j in b], tr_y[b])
        optimizer.zero_grad()
        loss = criterion(model(text, off), lab); loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1); optimizer.step()
        if i // 48 == 6: print(f"epoch {epoch} batch {i//48} loss {loss.item():.3f} mid val acc {evaluate():.3f}")
    scheduler.step(); print(f"end of epoch {epoch} val acc {evaluate():.3f} lr {scheduler.get_last_lr()[0]:.3f}")
