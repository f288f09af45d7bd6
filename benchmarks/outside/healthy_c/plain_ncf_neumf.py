"""Modelled on guoyang9/NCF (model.py NCF 'NeuMF-end', main.py, evaluate.py) -- Neural
Collaborative Filtering (He et al. 2017) with implicit feedback.

Synthetic user/item interactions from a low-rank preference model; leave-one-out split
(last positive per user held out), 4 sampled negatives per positive re-drawn every epoch,
BCEWithLogits on GMF + MLP towers, HR@10 / NDCG@10 evaluation against 49 sampled
negatives under model.eval()/no_grad, best-HR checkpoint.  Embedding tables are sparse
(sparse=True) and trained with torch.optim.SparseAdam while the dense towers use Adam:
two optimizers stepped together, as in the sparse-embedding recommender recipes."""
import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)
rng = np.random.default_rng(0)

# ------------------------------------------------------------------ data
user_num, item_num, k_true = 200, 300, 6
U = rng.normal(size=(user_num, k_true)); V = rng.normal(size=(item_num, k_true))
scores = U @ V.T + 0.5 * rng.normal(size=(user_num, item_num))
train_pos, test_pos = {}, {}
for u in range(user_num):
    top = np.argsort(-scores[u])[:15]                 # each user interacted with 15 items
    order = rng.permutation(top)
    test_pos[u] = int(order[-1])
    train_pos[u] = set(int(i) for i in order[:-1])
train_pairs = np.array([(u, i) for u in range(user_num) for i in sorted(train_pos[u])], dtype=np.int64)

def sample_negatives(num_ng=4):
    users, items, labels = [], [], []
    for u, i in train_pairs:
        users.append(u); items.append(i); labels.append(1.0)
        for _ in range(num_ng):
            j = int(rng.integers(item_num))
            while j in train_pos[u] or j == test_pos[u]:
                j = int(rng.integers(item_num))
            users.append(u); items.append(j); labels.append(0.0)
    return torch.tensor(users), torch.tensor(items), torch.tensor(labels)

test_users, test_items = [], []
for u in range(user_num):
    negs = set()
    while len(negs) < 49:
        j = int(rng.integers(item_num))
        if j not in train_pos[u] and j != test_pos[u]:
            negs.add(j)
    test_users.append([u] * 50); test_items.append([test_pos[u]] + sorted(negs))
test_users, test_items = torch.tensor(test_users), torch.tensor(test_items)

# ------------------------------------------------------------------ model
class NCF(nn.Module):
    def __init__(self, user_num, item_num, factor_num, num_layers, dropout):
        super().__init__()
        self.embed_user_GMF = nn.Embedding(user_num, factor_num, sparse=True)
        self.embed_item_GMF = nn.Embedding(item_num, factor_num, sparse=True)
        self.embed_user_MLP = nn.Embedding(user_num, factor_num * (2 ** (num_layers - 1)), sparse=True)
        self.embed_item_MLP = nn.Embedding(item_num, factor_num * (2 ** (num_layers - 1)), sparse=True)
        MLP_modules = []
        for i in range(num_layers):
            input_size = factor_num * (2 ** (num_layers - i))
            MLP_modules += [nn.Dropout(p=dropout), nn.Linear(input_size, input_size // 2), nn.ReLU()]
        self.MLP_layers = nn.Sequential(*MLP_modules)
        self.predict_layer = nn.Linear(factor_num * 2, 1)
        self._init_weight_()

    def _init_weight_(self):
        for e in (self.embed_user_GMF, self.embed_item_GMF, self.embed_user_MLP, self.embed_item_MLP):
            nn.init.normal_(e.weight, std=0.01)
        for m in self.MLP_layers:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                m.bias.data.zero_()
        nn.init.kaiming_uniform_(self.predict_layer.weight, a=1, nonlinearity="sigmoid")
        self.predict_layer.bias.data.zero_()

    def forward(self, user, item):
        output_GMF = self.embed_user_GMF(user) * self.embed_item_GMF(item)
        interaction = torch.cat((self.embed_user_MLP(user), self.embed_item_MLP(item)), -1)
        output_MLP = self.MLP_layers(interaction)
        concat = torch.cat((output_GMF, output_MLP), -1)
        return self.predict_layer(concat).view(-1)

def hit(gt_item, pred_items):
    return 1.0 if gt_item in pred_items else 0.0

def ndcg(gt_item, pred_items):
    if gt_item in pred_items:
        return 1.0 / np.log2(pred_items.index(gt_item) + 2)
    return 0.0

def metrics(model, top_k=10):
    model.eval()
    HR, NDCG = [], []
    with torch.no_grad():
        pred = model(test_users.reshape(-1), test_items.reshape(-1)).view(user_num, 50)
        _, indices = torch.topk(pred, top_k, dim=1)
        for u in range(user_num):
            recommends = torch.take(test_items[u], indices[u]).tolist()
            gt = int(test_items[u, 0])
            HR.append(hit(gt, recommends)); NDCG.append(ndcg(gt, recommends))
    return float(np.mean(HR)), float(np.mean(NDCG))

model = NCF(user_num, item_num, factor_num=16, num_layers=3, dropout=0.0)
sparse_params = [p for n, p in model.named_parameters() if n.startswith("embed_")]
dense_params = [p for n, p in model.named_parameters() if not n.startswith("embed_")]
sparse_opt = torch.optim.SparseAdam(sparse_params, lr=5e-3)
dense_opt = torch.optim.Adam(dense_params, lr=2e-3)
loss_function = nn.BCEWithLogitsLoss()

hr0, ndcg0 = metrics(model)
print(f"untrained: HR={hr0:.3f} NDCG={ndcg0:.3f}")
best_hr, batch_size, count = 0.0, 2048, 0
for epoch in range(4):                                 # 4 epochs x 7 batches = 28 steps
    model.train()
    users, items, labels = sample_negatives()
    perm = torch.randperm(len(users))
    for s in range(0, len(users), batch_size):
        idx = perm[s:s + batch_size]
        sparse_opt.zero_grad(); dense_opt.zero_grad()
        prediction = model(users[idx], items[idx])
        loss = loss_function(prediction, labels[idx])
        loss.backward()
        sparse_opt.step(); dense_opt.step()
        count += 1
    HR, NDCG = metrics(model)
    print(f"epoch {epoch:02d} step {count}: loss {loss.item():.4f} HR={HR:.3f} NDCG={NDCG:.3f}")
    if HR > best_hr:
        best_hr, best_epoch = HR, epoch
        torch.save(model.state_dict(), "ncf_neumf.pt")
print(f"End. Best epoch {best_epoch:03d}: HR = {best_hr:.3f}")
model.load_state_dict(torch.load("ncf_neumf.pt"))
print("reloaded best:", metrics(model))
