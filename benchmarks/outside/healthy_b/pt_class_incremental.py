"""Modelled on ContinualAI/avalanche's IncrementalClassifier (avalanche/models/dynamic_modules.py:
at each new experience `adaptation()` builds a larger nn.Linear head, copies the old rows in and
leaves the new rows freshly initialised) with the Naive/Replay strategy's per-experience
make_optimizer (a fresh optimizer over model.parameters() for every experience) and an
experience-replay buffer, evaluated after each epoch on all classes seen so far under
model.eval() + torch.inference_mode(). Class-incremental split of a synthetic 6-class problem
into 3 experiences of 2 classes."""
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
D = 20
centers = torch.randn(6, D) * 2
def sample(classes, n):
    y = torch.tensor(classes)[torch.randint(0, len(classes), (n,))]
    return centers[y] + torch.randn(n, D), y
class IncrementalClassifier(nn.Module):
    def __init__(self, in_features, initial_out_features=2):
        super().__init__(); self.classifier = nn.Linear(in_features, initial_out_features)
    @torch.no_grad()
    def adaptation(self, n_classes):
        old_w, old_b = self.classifier.weight, self.classifier.bias
        old_n = old_w.size(0)
        if n_classes <= old_n: return False
        self.classifier = nn.Linear(old_w.size(1), n_classes)   # new rows: default init
        self.classifier.weight[:old_n] = old_w; self.classifier.bias[:old_n] = old_b
        return True
    def forward(self, x): return self.classifier(x)
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 32), nn.ReLU())
        self.head = IncrementalClassifier(32, 2)
    def forward(self, x): return self.head(self.features(x))
model = Model(); buffer_x, buffer_y = [], []
experiences = [[0, 1], [2, 3], [4, 5]]; seen = []
for exp_id, classes in enumerate(experiences):
    seen += classes
    model.head.adaptation(len(seen))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)   # make_optimizer per experience
    X, Y = sample(classes, 320)
    for epoch in range(2):
        model.train(); perm = torch.randperm(len(X))
        for i in range(0, len(X), 32):
            idx = perm[i:i + 32]; x, y = X[idx], Y[idx]
            if buffer_x:
                j = torch.randint(0, len(buffer_x), (16,))
                x = torch.cat([x, torch.stack([buffer_x[k] for k in j])]); y = torch.cat([y, torch.stack([buffer_y[k] for k in j])])
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward(); optimizer.step()
        model.eval()
        with torch.inference_mode():
            Xe, Ye = sample(seen, 300); acc = (model(Xe).argmax(1) == Ye).float().mean().item()
        print(f"exp {exp_id} epoch {epoch} loss {loss.item():.3f} acc_seen {acc:.3f} head {tuple(model.head.classifier.weight.shape)}")
    for k in torch.randperm(len(X))[:40]: buffer_x.append(X[k]); buffer_y.append(Y[k])
