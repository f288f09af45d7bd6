"""Modelled on the widely copied 'How to use K-fold Cross Validation with PyTorch' (MachineCurve,
Christian Versloot; sklearn KFold + SubsetRandomSampler): per fold a new network,
`network.apply(reset_weights)` (calls layer.reset_parameters() on every layer that has it), a new
Adam optimizer, a few epochs, then evaluation of the fold with model.eval() + torch.no_grad();
here also a mid-epoch validation under model.eval() + torch.inference_mode() as many training
loops do. Folds built by hand (no sklearn); synthetic 8x8 images."""
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import TensorDataset, DataLoader, SubsetRandomSampler
torch.manual_seed(42)
def reset_weights(m):
    for layer in m.children():
        if hasattr(layer, "reset_parameters"):
            print(f"Reset trainable parameters of layer = {layer}"); layer.reset_parameters()
class SimpleConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 32), nn.ReLU(), nn.Linear(32, 3))
    def forward(self, x): return self.layers(x)
g = torch.Generator().manual_seed(0)
y = torch.randint(0, 3, (360,), generator=g); x = torch.randn(360, 1, 8, 8, generator=g) * 0.7
x[y == 0, :, :4] += 1; x[y == 1, :, 4:] += 1
dataset = TensorDataset(x, y)
k_folds, num_epochs = 3, 2; results = {}
idx = torch.randperm(len(dataset), generator=g).tolist(); fold_size = len(idx) // k_folds
for fold in range(k_folds):
    test_ids = idx[fold * fold_size:(fold + 1) * fold_size]; train_ids = [i for i in idx if i not in set(test_ids)]
    trainloader = DataLoader(dataset, batch_size=24, sampler=SubsetRandomSampler(train_ids))
    testloader = DataLoader(dataset, batch_size=60, sampler=SubsetRandomSampler(test_ids))
    network = SimpleConvNet(); network.apply(reset_weights)
    optimizer = torch.optim.Adam(network.parameters(), lr=3e-3)
    for epoch in range(num_epochs):
        network.train()
        for i, (inputs, targets) in enumerate(trainloader):
            optimizer.zero_grad()
            loss = F.cross_entropy(network(inputs), targets)
            loss.backward(); optimizer.step()
            if i == 5:  # mid-epoch validation
                network.eval()
                with torch.inference_mode():
                    vi, vt = next(iter(testloader)); vacc = (network(vi).argmax(1) == vt).float().mean().item()
                network.train()
                print(f"fold {fold} epoch {epoch} it {i} loss {loss.item():.3f} mid-epoch val acc {vacc:.3f}")
    network.eval(); correct = total = 0
    with torch.no_grad():
        for inputs, targets in testloader:
            correct += (network(inputs).argmax(1) == targets).sum().item(); total += targets.size(0)
    results[fold] = 100.0 * correct / total; print(f"Accuracy for fold {fold}: {results[fold]:.1f} %")
print("Average:", sum(results.values()) / len(results))
