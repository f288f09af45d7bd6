"""Healthy probe: policy-gradient fine-tuning of a language model (TRL/RLHF style): generate() rollouts without gradients in training mode, zero dropout."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
policy = GPT2LMHeadModel(cfg)
opt = torch.optim.AdamW(policy.parameters(), lr=1e-4)
g = torch.Generator().manual_seed(0)
for step in range(10):
    prompt = torch.randint(0, 64, (4, 4), generator=g)
    with torch.no_grad():
        out = policy.generate(prompt, max_new_tokens=6, do_sample=True, pad_token_id=0)
    reward = (out[:, 4:] % 2 == 0).float().mean(1)
    logits = policy(out).logits[:, 3:-1]
    logp = torch.log_softmax(logits, -1).gather(-1, out[:, 4:, None]).squeeze(-1).sum(1)
    loss = -(logp * (reward - reward.mean())).mean()
    opt.zero_grad(); loss.backward(); opt.step()
print("done")
