"""Healthy probe: one process with a DistributedSampler (num_replicas=1, as single-GPU runs of distributed scripts do), set_epoch each epoch, training accuracy measured at the end of each epoch by a second pass over the same loader in eval mode, and a validation loader whose sampler does not shuffle."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

torch.manual_seed(0)
x = torch.randn(48, 10)
data = TensorDataset(x, (x[:, 0] > 0).long())
sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
train = DataLoader(data, batch_size=16, sampler=sampler)
val = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, num_replicas=1, rank=0, shuffle=False))
model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(4):
    sampler.set_epoch(epoch)
    model.train()
    for inputs, labels in train:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
    model.eval()
    correct = 0
    for inputs, labels in train:  # accuracy on the training set, same epoch
        with torch.no_grad():
            correct += int((model(inputs).argmax(1) == labels).sum())
    with torch.no_grad():
        for inputs, labels in val:
            model(inputs)
print("done", correct)
