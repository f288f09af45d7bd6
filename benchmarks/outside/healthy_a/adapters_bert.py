"""Healthy: Houlsby et al. 2019 bottleneck adapters ("Parameter-Efficient Transfer Learning for NLP", as packaged by
adapter-transformers / AdapterHub's `houlsby` config): a BertForSequenceClassification (built from a small
BertConfig, no download) gets an Adapter (down-project, GELU, up-project initialised near zero, residual) inserted
after the attention-output and FFN-output dense layers of every layer; all base weights are frozen
(requires_grad=False) except the adapters, the LayerNorms and the classifier, which an AdamW with
get_linear_schedule_with_warmup trains in a hand-written loop; model.eval() evaluation every 10 steps."""
import torch
from torch import nn
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup
torch.manual_seed(0)
class Adapter(nn.Module):
    def __init__(self, hidden, bottleneck=8):
        super().__init__()
        self.down = nn.Linear(hidden, bottleneck); self.act = nn.GELU(); self.up = nn.Linear(bottleneck, hidden)
        nn.init.normal_(self.down.weight, std=1e-2); nn.init.zeros_(self.down.bias)
        nn.init.normal_(self.up.weight, std=1e-2); nn.init.zeros_(self.up.bias)
    def forward(self, x): return x + self.up(self.act(self.down(x)))
class DenseWithAdapter(nn.Module):
    def __init__(self, dense, hidden):
        super().__init__(); self.dense = dense; self.adapter = Adapter(hidden)
    def forward(self, x): return self.adapter(self.dense(x))
cfg = BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                 max_position_embeddings=64, num_labels=2)
model = BertForSequenceClassification(cfg)
for layer in model.bert.encoder.layer:
    layer.attention.output.dense = DenseWithAdapter(layer.attention.output.dense, cfg.hidden_size)
    layer.output.dense = DenseWithAdapter(layer.output.dense, cfg.hidden_size)
for name, p in model.named_parameters():
    p.requires_grad = ("adapter" in name) or ("LayerNorm" in name) or name.startswith("classifier")
trainable = [p for p in model.parameters() if p.requires_grad]
print(f"trainable {sum(p.numel() for p in trainable)} / {sum(p.numel() for p in model.parameters())}")
def batch(n):
    ids = torch.randint(5, 200, (n, 24)); y = (ids[:, :4] < 100).sum(1).ge(2).long()
    ids[:, 0] = 1; return ids, torch.ones_like(ids), y
opt = torch.optim.AdamW(trainable, lr=1e-3, weight_decay=0.01)
steps = 40; sched = get_linear_schedule_with_warmup(opt, 4, steps)
model.train()
for step in range(steps):
    ids, mask, y = batch(16)
    out = model(input_ids=ids, attention_mask=mask, labels=y)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    opt.step(); sched.step(); opt.zero_grad()
    if step % 10 == 9:
        model.eval()
        with torch.no_grad():
            ids, mask, y = batch(64); acc = (model(input_ids=ids, attention_mask=mask).logits.argmax(-1) == y).float().mean()
        model.train(); print(f"step {step} loss {out.loss.item():.3f} acc {acc:.2f}")
