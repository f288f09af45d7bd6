"""Modelled on facebookresearch/dino main_dino.py: student and teacher of the same architecture,
teacher.load_state_dict(student.state_dict()) then requires_grad False; teacher updated only by
EMA (momentum cosine-scheduled from 0.99 to 1.0); DINOLoss with a centred, sharpened teacher softmax
as soft targets; param groups regularized / not_regularized with a per-iteration weight-decay
schedule on group 0; cancel_gradients_last_layer (last-layer grads set to None during the first
'freeze_last_layer' iterations); weight-normalised last layer with weight_g frozen
(norm_last_layer=True); clip_gradients per parameter. A kNN-style probe on the teacher runs each
epoch under teacher.eval() + torch.inference_mode(). MLP backbone on synthetic 2-view data."""
import math, torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
D, OUT, EPOCHS, ITERS = 24, 64, 4, 12
protos = torch.randn(5, D)
def views(bs):
    y = torch.randint(0, 5, (bs,)); base = protos[y]
    aug = lambda x: x * (1 + 0.2 * torch.randn_like(x)) + 0.3 * torch.randn_like(x)
    return aug(base), aug(base), y
class DINOHead(nn.Module):
    def __init__(self, in_dim, out_dim, norm_last_layer=True):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_dim, 64), nn.GELU(), nn.Linear(64, 32))
        self.last_layer = nn.utils.weight_norm(nn.Linear(32, out_dim, bias=False))
        self.last_layer.weight_g.data.fill_(1)
        if norm_last_layer: self.last_layer.weight_g.requires_grad = False
    def forward(self, x):
        return self.last_layer(F.normalize(self.mlp(x), dim=-1, p=2))
class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(D, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 48))
        self.head = DINOHead(48, OUT)
    def forward(self, x): return self.head(self.backbone(x))
class DINOLoss(nn.Module):
    def __init__(self, out_dim, tt=0.04, st=0.1, cm=0.9):
        super().__init__(); self.tt, self.st, self.cm = tt, st, cm
        self.register_buffer("center", torch.zeros(1, out_dim))
    def forward(self, s_out, t_out):
        s = [o / self.st for o in s_out]
        t = [F.softmax((o - self.center) / self.tt, dim=-1).detach() for o in t_out]
        loss = 0; n = 0
        for iq, q in enumerate(t):
            for v, so in enumerate(s):
                if v == iq: continue
                loss = loss + torch.sum(-q * F.log_softmax(so, dim=-1), dim=-1).mean(); n += 1
        self.update_center(torch.cat(t_out)); return loss / n
    @torch.no_grad()
    def update_center(self, t_out):
        self.center = self.center * self.cm + t_out.mean(0, keepdim=True) * (1 - self.cm)
def cosine_scheduler(base, final, epochs, niter, warmup_epochs=0, start_warmup=0):
    sched = []
    wi = warmup_epochs * niter
    for i in range(epochs * niter):
        if i < wi: sched.append(start_warmup + (base - start_warmup) * i / wi)
        else: sched.append(final + 0.5 * (base - final) * (1 + math.cos(math.pi * (i - wi) / (epochs * niter - wi))))
    return sched
def get_params_groups(model):
    reg, noreg = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad: continue
        (noreg if n.endswith(".bias") or p.ndim == 1 else reg).append(p)
    return [{"params": reg}, {"params": noreg, "weight_decay": 0.0}]
def clip_gradients(model, clip):
    for p in model.parameters():
        if p.grad is not None:
            norm = p.grad.data.norm(2); cf = clip / (norm + 1e-6)
            if cf < 1: p.grad.data.mul_(cf)
def cancel_gradients_last_layer(it, model, freeze_last_layer_iters):
    if it >= freeze_last_layer_iters: return
    for n, p in model.named_parameters():
        if "last_layer" in n: p.grad = None
student, teacher = Wrapper(), Wrapper()
teacher.load_state_dict(student.state_dict())
for p in teacher.parameters(): p.requires_grad = False
dino_loss = DINOLoss(OUT)
opt = torch.optim.AdamW(get_params_groups(student))
lr_s = cosine_scheduler(2e-3, 1e-5, EPOCHS, ITERS, warmup_epochs=1)
wd_s = cosine_scheduler(0.04, 0.4, EPOCHS, ITERS)
mom_s = cosine_scheduler(0.99, 1.0, EPOCHS, ITERS)
def knn_probe():
    teacher.eval()
    with torch.inference_mode():
        a, _, ya = views(200); b, _, yb = views(100)
        fa, fb = F.normalize(teacher.backbone(a), dim=1), F.normalize(teacher.backbone(b), dim=1)
        pred = ya[(fb @ fa.T).argmax(1)]
    teacher.train(); return (pred == yb).float().mean().item()
for epoch in range(EPOCHS):
    student.train()
    for i in range(ITERS):
        it = epoch * ITERS + i
        for k, g in enumerate(opt.param_groups):
            g["lr"] = lr_s[it]
            if k == 0: g["weight_decay"] = wd_s[it]
        v1, v2, _ = views(32)
        t_out = [teacher(v1), teacher(v2)]
        s_out = [student(v1), student(v2)]
        loss = dino_loss(s_out, t_out)
        opt.zero_grad(); loss.backward()
        clip_gradients(student, 3.0)
        cancel_gradients_last_layer(it, student, freeze_last_layer_iters=ITERS)
        opt.step()
        with torch.no_grad():
            m = mom_s[it]
            for ps, pt in zip(student.parameters(), teacher.parameters()):
                pt.data.mul_(m).add_((1 - m) * ps.detach().data)
    print(f"epoch {epoch} loss {loss.item():.4f} knn_acc {knn_probe():.3f}")
