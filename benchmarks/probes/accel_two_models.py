"""Healthy probe: Hugging Face Accelerate with two models and two optimizers, as in the Accelerate docs' gradient-accumulation guide for several models ("accelerator.accumulate(model1, model2)") applied to a dual-encoder retriever: a query tower and a document tower each with its own AdamW and LR scheduler, all passed through one accelerator.prepare, in-batch-negative cross-entropy, gradient_accumulation_steps=2, accelerator.clip_grad_norm_ on each tower when sync_gradients, and a recall@1 evaluation in eval mode under torch.no_grad with accelerator.gather_for_metrics.

The prepared optimizers and schedulers skip their step and zero_grad on accumulation
micro-batches; 24 micro-batches give 12 optimizer steps per optimizer.
"""
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn

SEED, VOCAB, LENGTH, DIM = 0, 64, 8, 32
accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
set_seed(SEED)


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, DIM, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(DIM, DIM), nn.GELU(), nn.Dropout(0.1), nn.Linear(DIM, DIM))

    def forward(self, ids):
        return F.normalize(self.mlp(self.embed(ids)), dim=-1)


def pairs(n, seed):
    """A document shares half its tokens with its query."""
    g = torch.Generator().manual_seed(seed)
    queries = torch.randint(0, VOCAB, (n, LENGTH), generator=g)
    docs = torch.randint(0, VOCAB, (n, LENGTH), generator=g)
    docs[:, :LENGTH // 2] = queries[:, :LENGTH // 2]
    return torch.utils.data.TensorDataset(queries, docs)


query_tower, doc_tower = Tower(), Tower()
opt_q = torch.optim.AdamW(query_tower.parameters(), lr=5e-3, weight_decay=0.01)
opt_d = torch.optim.AdamW(doc_tower.parameters(), lr=2e-3, weight_decay=0.01)
sched_q = torch.optim.lr_scheduler.CosineAnnealingLR(opt_q, T_max=12)
sched_d = torch.optim.lr_scheduler.CosineAnnealingLR(opt_d, T_max=12)
train_dl = torch.utils.data.DataLoader(pairs(192, 1), batch_size=8, shuffle=True, drop_last=True)
eval_dl = torch.utils.data.DataLoader(pairs(40, 2), batch_size=16)
query_tower, doc_tower, opt_q, opt_d, sched_q, sched_d, train_dl, eval_dl = accelerator.prepare(
    query_tower, doc_tower, opt_q, opt_d, sched_q, sched_d, train_dl, eval_dl)
temperature = 0.1

for epoch in range(1):
    query_tower.train(); doc_tower.train()
    for step, (q, d) in enumerate(train_dl):
        with accelerator.accumulate(query_tower, doc_tower):
            logits = query_tower(q) @ doc_tower(d).T / temperature
            loss = F.cross_entropy(logits, torch.arange(q.size(0), device=q.device))
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(query_tower.parameters(), 1.0)
                accelerator.clip_grad_norm_(doc_tower.parameters(), 1.0)
            opt_q.step(); opt_d.step()
            sched_q.step(); sched_d.step()
            opt_q.zero_grad(); opt_d.zero_grad()
        if accelerator.sync_gradients and step % 6 == 5:
            accelerator.print(f"step {step} loss {loss.item():.4f}")

    query_tower.eval(); doc_tower.eval()
    hits = []
    with torch.no_grad():
        for q, d in eval_dl:
            scores = query_tower(q) @ doc_tower(d).T
            hit = scores.argmax(1) == torch.arange(q.size(0), device=q.device)
            hits.append(accelerator.gather_for_metrics(hit))
    accelerator.print(f"epoch {epoch} recall@1 {torch.cat(hits).float().mean().item():.3f}")
accelerator.end_training()
