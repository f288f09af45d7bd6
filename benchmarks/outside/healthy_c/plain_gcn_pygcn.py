"""Modelled on tkipf/pygcn (pygcn/train.py, layers.py, models.py) -- Kipf & Welling GCN
for semi-supervised node classification, written without PyG.

Synthetic 'Cora-like' graph from a stochastic block model: class-dependent bag-of-words
features, row-normalised features, symmetric-normalised sparse adjacency D^-1/2 (A+I) D^-1/2
as a torch.sparse COO tensor, masked train/val/test node splits, Adam with weight decay,
dropout, early-stopping-on-val-loss with best-state checkpointing (state_dict copy), and the
model wrapped in torch.compile (the forward contains torch.sparse.mm)."""
import math, time, copy
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(42)

# ------------------------------------------------------------ synthetic graph
n_nodes, n_feat, n_class = 600, 200, 5
g = torch.Generator().manual_seed(0)
labels = torch.randint(0, n_class, (n_nodes,), generator=g)
p_in, p_out = 0.03, 0.002
same = labels[:, None] == labels[None, :]
prob = torch.where(same, torch.full((n_nodes, n_nodes), p_in), torch.full((n_nodes, n_nodes), p_out))
upper = torch.triu(torch.rand(n_nodes, n_nodes, generator=g) < prob, diagonal=1)
adj_dense = (upper | upper.t()).float()

# class-dependent sparse binary features
topic = torch.rand(n_class, n_feat, generator=g) ** 4
features = (torch.rand(n_nodes, n_feat, generator=g) < 0.05 + 0.3 * topic[labels]).float()

def normalize_rows(mx):
    rowsum = mx.sum(1, keepdim=True)
    r_inv = rowsum.pow(-1)
    r_inv[torch.isinf(r_inv)] = 0.
    return mx * r_inv

def normalize_adj(a):
    a = a + torch.eye(a.size(0))
    d = a.sum(1).pow(-0.5)
    d[torch.isinf(d)] = 0.
    return d[:, None] * a * d[None, :]

features = normalize_rows(features)
adj = normalize_adj(adj_dense).to_sparse()

perm = torch.randperm(n_nodes, generator=g)
idx_train, idx_val, idx_test = perm[:140], perm[140:340], perm[340:]

# ------------------------------------------------------------ model
class GraphConvolution(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1. / math.sqrt(self.weight.size(1))
        self.weight.data.uniform_(-stdv, stdv)
        if self.bias is not None:
            self.bias.data.uniform_(-stdv, stdv)

    def forward(self, input, adj):
        support = torch.mm(input, self.weight)
        output = torch.sparse.mm(adj, support)
        return output + self.bias if self.bias is not None else output

class GCN(nn.Module):
    def __init__(self, nfeat, nhid, nclass, dropout):
        super().__init__()
        self.gc1 = GraphConvolution(nfeat, nhid)
        self.gc2 = GraphConvolution(nhid, nclass)
        self.dropout = dropout

    def forward(self, x, adj):
        x = F.relu(self.gc1(x, adj))
        x = F.dropout(x, self.dropout, training=self.training)
        x = self.gc2(x, adj)
        return F.log_softmax(x, dim=1)

model = GCN(nfeat=n_feat, nhid=16, nclass=n_class, dropout=0.5)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
cmodel = torch.compile(model)

def accuracy(output, labels):
    preds = output.max(1)[1].type_as(labels)
    return preds.eq(labels).double().sum() / len(labels)

def train(epoch):
    t = time.time()
    cmodel.train()
    optimizer.zero_grad()
    output = cmodel(features, adj)
    loss_train = F.nll_loss(output[idx_train], labels[idx_train])
    acc_train = accuracy(output[idx_train], labels[idx_train])
    loss_train.backward()
    optimizer.step()

    cmodel.eval()
    with torch.no_grad():
        output = cmodel(features, adj)
    loss_val = F.nll_loss(output[idx_val], labels[idx_val])
    acc_val = accuracy(output[idx_val], labels[idx_val])
    print(f"Epoch: {epoch + 1:04d} loss_train: {loss_train.item():.4f} acc_train: {acc_train.item():.4f} "
          f"loss_val: {loss_val.item():.4f} acc_val: {acc_val.item():.4f} time: {time.time() - t:.4f}s")
    return loss_val.item()

def test():
    cmodel.eval()
    with torch.no_grad():
        output = cmodel(features, adj)
    loss_test = F.nll_loss(output[idx_test], labels[idx_test])
    acc_test = accuracy(output[idx_test], labels[idx_test])
    print(f"Test set results: loss= {loss_test.item():.4f} accuracy= {acc_test.item():.4f}")

t_total = time.time()
best, bad_counter, patience, best_state = float("inf"), 0, 10, None
for epoch in range(60):
    loss_val = train(epoch)
    if loss_val < best:
        best, bad_counter = loss_val, 0
        best_state = copy.deepcopy(model.state_dict())
    else:
        bad_counter += 1
    if bad_counter == patience:
        break
print("Optimization Finished!")
print(f"Total time elapsed: {time.time() - t_total:.4f}s")
model.load_state_dict(best_state)
test()
