"""Healthy probe: pre-training then fine-tuning in one script with a new optimizer at a lower rate, best weights kept as a copy and restored before the test, and an in-process restart from a weights-only checkpoint with a fresh optimizer (the torchvision transfer-learning tutorial's best-model copy)."""
import copy

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2))


def epoch(optimizer, steps=3):
    model.train()
    for _ in range(steps):
        x = torch.randn(16, 10)
        y = (x[:, 0] > 0).long()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def validate():
    model.eval()
    with torch.no_grad():
        x = torch.randn(32, 10)
        accuracy = float((model(x).argmax(1) == (x[:, 0] > 0).long()).float().mean())
    model.train()
    return accuracy


epoch(torch.optim.Adam(model.parameters(), lr=1e-3))  # pre-training
checkpoint = {k: v.clone() for k, v in model.state_dict().items()}
finetune = torch.optim.Adam(model.parameters(), lr=1e-4)  # fine-tuning phase: another rate
best, best_weights = -1.0, copy.deepcopy(model.state_dict())
for _ in range(2):
    epoch(finetune)
    accuracy = validate()
    if accuracy > best:
        best, best_weights = accuracy, copy.deepcopy(model.state_dict())
model.load_state_dict(checkpoint)  # a fault: restart from the weights-only checkpoint
restarted = torch.optim.Adam(model.parameters(), lr=1e-4)
epoch(restarted)
model.load_state_dict(best_weights)
print("test accuracy", validate())
