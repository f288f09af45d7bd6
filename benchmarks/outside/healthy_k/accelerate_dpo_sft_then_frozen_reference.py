"""Two-stage preference tuning with accelerate: SFT, then DPO against a frozen reference copy.

Modelled on: eric-mitchell/direct-preference-optimization (Rafailov et al., "Direct
Preference Optimization", NeurIPS 2023), ``trainers.py``: ``preference_loss``
(``-logsigmoid(beta * ((pi_c - pi_r) - (ref_c - ref_r)))``, rewards
``beta * (policy_logps - reference_logps).detach()``), ``_get_batch_logps`` (shifted
labels, -100 mask, summed log-probs), ``concatenated_forward`` (chosen and rejected in
one batch), RMSprop with the warm-up ``LambdaLR(lambda step: min(1.0, (step + 1) /
(warmup_steps + 1)))``, clipping, and the SFT-then-DPO recipe of ``config/loss/sft.yaml``
→ ``config/loss/dpo.yaml``; the harness is accelerate (``accumulate``, bf16 autocast,
``prepare_model(..., evaluation_mode=True)`` for the reference, as in TRL's DPOTrainer).

What is unusual about the loop (all on purpose):
  * mid-run the trained SFT policy is deep-copied into a frozen reference (eval mode, no
    grads, never stepped), the accelerator is reset with ``free_memory()`` and a new
    optimizer/scheduler (different class) is prepared for the DPO stage;
  * at the first DPO step policy == reference, so the loss is exactly log 2 and all
    rewards are 0, while the gradient is not zero;
  * gradient accumulation of 2: ``optimizer.step()``/``scheduler.step()``/``zero_grad()``
    are called on every micro-batch and are no-ops except on sync steps;
  * the DPO loss can rise while chosen log-probs fall: DPO only widens the margin.
"""
import copy

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel

torch.set_num_threads(1)
EQ, EOS, PAD, N_DIGITS = 10, 11, 12, 5


def make_pairs(n, seed):
    """Prompt: 5 digits then '='; chosen = digits sorted + EOS; rejected = a corrupted order + EOS."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        digits = torch.randint(0, 10, (N_DIGITS,), generator=g)
        chosen = digits.sort().values
        rejected = chosen.clone()
        while torch.equal(rejected, chosen):
            if torch.rand((), generator=g) < 0.5:   # near miss: swap two positions
                i, j = torch.randperm(N_DIGITS, generator=g)[:2].tolist()
                rejected[[i, j]] = rejected[[j, i]]
            else:
                rejected = digits[torch.randperm(N_DIGITS, generator=g)]
        prompt = digits.tolist() + [EQ]
        pairs.append({"prompt": prompt, "chosen": chosen.tolist() + [EOS], "rejected": rejected.tolist() + [EOS]})
    return pairs


def tokenize(prompt, response):
    ids = torch.tensor(prompt + response)
    labels = ids.clone()
    labels[: len(prompt)] = -100
    return ids, labels


def collate(batch):
    ids_c, lab_c = zip(*[tokenize(ex["prompt"], ex["chosen"]) for ex in batch])
    ids_r, lab_r = zip(*[tokenize(ex["prompt"], ex["rejected"]) for ex in batch])
    return {"chosen_input_ids": torch.stack(ids_c), "chosen_labels": torch.stack(lab_c),
            "rejected_input_ids": torch.stack(ids_r), "rejected_labels": torch.stack(lab_r)}


def _get_batch_logps(logits, labels):
    labels = labels[:, 1:].clone()
    logits = logits[:, :-1, :]
    loss_mask = labels != -100
    labels[labels == -100] = 0
    per_token_logps = torch.gather(logits.float().log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2)
    return (per_token_logps * loss_mask).sum(-1)


def concatenated_forward(model, batch):
    input_ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]], dim=0)
    labels = torch.cat([batch["chosen_labels"], batch["rejected_labels"]], dim=0)
    all_logps = _get_batch_logps(model(input_ids).logits, labels)
    n = batch["chosen_input_ids"].shape[0]
    return all_logps[:n], all_logps[n:]


def preference_loss(pi_c, pi_r, ref_c, ref_r, beta):
    logits = (pi_c - pi_r) - (ref_c - ref_r)
    losses = -F.logsigmoid(beta * logits)
    return losses, beta * (pi_c - ref_c).detach(), beta * (pi_r - ref_r).detach()


@torch.no_grad()
def evaluate(policy, reference, loader, beta):
    policy.eval()
    acc, margin, chosen_lp = [], [], []
    for batch in loader:
        pi_c, pi_r = concatenated_forward(policy, batch)
        ref_c, ref_r = concatenated_forward(reference, batch)
        _, r_c, r_r = preference_loss(pi_c, pi_r, ref_c, ref_r, beta)
        acc.append((r_c > r_r).float())
        margin.append(r_c - r_r)
        chosen_lp.append(pi_c)
    policy.train()
    return torch.cat(acc).mean().item(), torch.cat(margin).mean().item(), torch.cat(chosen_lp).mean().item()


def main():
    set_seed(0)
    accelerator = Accelerator(gradient_accumulation_steps=2, mixed_precision="bf16", cpu=True)
    config = GPT2Config(vocab_size=13, n_positions=16, n_embd=64, n_layer=2, n_head=4, bos_token_id=EOS,
                        eos_token_id=EOS, pad_token_id=PAD, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    policy = GPT2LMHeadModel(config)
    train_pairs, eval_pairs = make_pairs(800, 1), make_pairs(64, 2)
    eval_loader = DataLoader(eval_pairs, batch_size=64, collate_fn=collate)

    # ---- stage 1: SFT on the chosen responses (loss: sft) ----
    sft_loader = DataLoader(train_pairs[:320], batch_size=16, shuffle=True, collate_fn=collate)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 3))
    policy, optimizer, scheduler, sft_loader = accelerator.prepare(policy, optimizer, scheduler, sft_loader)
    for step, batch in enumerate(sft_loader):
        with accelerator.accumulate(policy):
            out = policy(batch["chosen_input_ids"], labels=batch["chosen_labels"])
            accelerator.backward(out.loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(policy.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients and (step + 1) % 10 == 0:
            print(f"[sft] micro-step {step + 1}: nll {out.loss.item():.3f}  lr {scheduler.get_last_lr()[0]:.2e}")

    # ---- stage 2: DPO with the SFT model as frozen reference (loss: dpo) ----
    beta = 0.1
    policy = accelerator.unwrap_model(policy, keep_fp32_wrapper=False)  # drop the autocast wrapper before re-preparing
    del optimizer, scheduler, sft_loader
    accelerator.free_memory()
    reference = copy.deepcopy(policy).eval()
    reference.requires_grad_(False)
    reference = accelerator.prepare_model(reference, evaluation_mode=True)
    dpo_loader = DataLoader(train_pairs[320:], batch_size=8, shuffle=True, collate_fn=collate)
    optimizer = torch.optim.RMSprop(policy.parameters(), lr=3e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / (5 + 1)))
    policy, optimizer, scheduler, dpo_loader = accelerator.prepare(policy, optimizer, scheduler, dpo_loader)
    acc, margin, lp = evaluate(policy, reference, eval_loader, beta)
    print(f"[dpo eval] before: reward acc {acc:.3f}  margin {margin:.4f}  chosen logp {lp:.3f}")
    opt_steps = 0
    for step, batch in enumerate(dpo_loader):
        with accelerator.accumulate(policy):
            pi_c, pi_r = concatenated_forward(policy, batch)
            with torch.no_grad():
                ref_c, ref_r = concatenated_forward(reference, batch)
            losses, r_c, r_r = preference_loss(pi_c, pi_r, ref_c, ref_r, beta)
            loss = losses.mean()
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(policy.parameters(), 10.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            opt_steps += 1
            if opt_steps == 1:
                print(f"[dpo] first step loss {loss.item():.6f} (log 2 = 0.693147), rewards {r_c.abs().max().item():.1e}")
            if opt_steps % 10 == 0:
                acc, margin, lp = evaluate(policy, reference, eval_loader, beta)
                print(f"[dpo eval] opt step {opt_steps}: train loss {loss.item():.4f}  reward acc {acc:.3f}  "
                      f"margin {margin:.4f}  chosen logp {lp:.3f}")
    ref_changed = any(p.grad is not None for p in accelerator.unwrap_model(reference).parameters())
    print(f"done: {opt_steps} DPO optimizer steps; reference received grads: {ref_changed}")


if __name__ == "__main__":
    main()
