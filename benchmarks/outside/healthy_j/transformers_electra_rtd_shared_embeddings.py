"""ELECTRA pre-training (replaced-token detection) with a generator and a discriminator.

Modelled on: google-research/electra ``run_pretraining.py`` / ``pretrain/pretrain_helpers.py``
(Clark et al., "ELECTRA: Pre-training Text Encoders as Discriminators Rather Than
Generators", ICLR 2020) as re-implemented on top of transformers' ``ElectraForMaskedLM``
and ``ElectraForPreTraining`` (e.g. lucidrains/electra-pytorch, the HF ELECTRA model
docs): a small generator (1/2 of the discriminator hidden size) fills 15% masked positions
by *sampling* from its MLM softmax, the discriminator labels every token as original or
replaced, the two share token/position embeddings, and the total loss is
``gen_mlm_loss + 50 * disc_loss`` optimised by one AdamW with linear warm-up and decay.
Both models are built from ``ElectraConfig`` (no downloads); the corpus is a synthetic
first-order Markov "language".

What is unusual about the loop:
  * Two models, one optimizer; the embedding module is the same object in both models,
    so its parameters receive gradients from both losses (de-duplicated in the optimizer).
  * The generator's tokens are sampled under ``no_grad``: no gradient flows from the
    discriminator loss into the generator except through the shared embeddings.
  * Warm-up starts from lr 0, so the first optimizer step leaves every weight unchanged.
  * Non-reentrant gradient checkpointing in the discriminator (activations recomputed
    in backward).
  * Evaluation in the middle of training on fixed masks: the eval masking/sampling uses a
    ``torch.Generator`` re-seeded at every evaluation, so evaluations are comparable.
"""
import math

import torch
from transformers import (ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining,
                          get_linear_schedule_with_warmup)

torch.set_num_threads(1)
torch.manual_seed(0)

VOCAB, SEQ_LEN, PAD, CLS, SEP, MASK = 68, 40, 0, 1, 2, 3
N_SPECIAL = 4


def make_markov_corpus(n_seqs, seed):
    g = torch.Generator().manual_seed(seed)
    n_words = VOCAB - N_SPECIAL
    # sparse transition matrix: every word has 4 likely successors
    trans = torch.full((n_words, n_words), 1e-3)
    succ = torch.randint(0, n_words, (n_words, 4), generator=torch.Generator().manual_seed(42))
    trans.scatter_(1, succ, 1.0)
    trans = trans / trans.sum(1, keepdim=True)
    seqs = torch.empty(n_seqs, SEQ_LEN, dtype=torch.long)
    cur = torch.randint(0, n_words, (n_seqs,), generator=g)
    for t in range(SEQ_LEN - 2):
        seqs[:, t + 1] = cur + N_SPECIAL
        cur = torch.multinomial(trans[cur], 1, generator=g).squeeze(1)
    seqs[:, 0], seqs[:, -1] = CLS, SEP
    return seqs


def mask_tokens(input_ids, mask_prob, g):
    special = input_ids < N_SPECIAL
    probs = torch.full(input_ids.shape, mask_prob)
    probs[special] = 0.0
    masked = torch.bernoulli(probs, generator=g).bool()
    masked_ids = input_ids.clone()
    masked_ids[masked] = MASK
    mlm_labels = input_ids.clone()
    mlm_labels[~masked] = -100
    return masked_ids, mlm_labels, masked


def sample_from_generator(gen_logits, g):
    probs = torch.softmax(gen_logits.float(), dim=-1)
    return torch.multinomial(probs.view(-1, probs.size(-1)), 1, generator=g).view(probs.shape[:-1])


def electra_step(generator, discriminator, input_ids, g, disc_weight=50.0):
    attention_mask = torch.ones_like(input_ids)
    masked_ids, mlm_labels, masked = mask_tokens(input_ids, 0.15, g)
    gen_out = generator(input_ids=masked_ids, attention_mask=attention_mask, labels=mlm_labels)
    with torch.no_grad():
        sampled = sample_from_generator(gen_out.logits.detach(), g)
    disc_input = torch.where(masked, sampled, input_ids)
    disc_labels = (disc_input != input_ids).long()   # a correct guess counts as "original"
    disc_out = discriminator(input_ids=disc_input, attention_mask=attention_mask, labels=disc_labels)
    loss = gen_out.loss + disc_weight * disc_out.loss
    stats = {
        "gen_loss": gen_out.loss.item(),
        "disc_loss": disc_out.loss.item(),
        "gen_acc": (gen_out.logits.argmax(-1)[masked] == input_ids[masked]).float().mean().item(),
        "disc_acc": ((disc_out.logits > 0).long() == disc_labels).float().mean().item(),
        "replaced_frac": disc_labels.float().mean().item(),
    }
    return loss, stats


@torch.no_grad()
def evaluate(generator, discriminator, eval_ids):
    generator.eval()
    discriminator.eval()
    g = torch.Generator().manual_seed(1234)   # same masks and samples at every evaluation
    _, stats = electra_step(generator, discriminator, eval_ids, g)
    generator.train()
    discriminator.train()
    return stats


def main():
    disc_config = ElectraConfig(vocab_size=VOCAB, embedding_size=32, hidden_size=64,
                                num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                                max_position_embeddings=SEQ_LEN, pad_token_id=PAD)
    gen_config = ElectraConfig(vocab_size=VOCAB, embedding_size=32, hidden_size=32,
                               num_hidden_layers=2, num_attention_heads=1, intermediate_size=64,
                               max_position_embeddings=SEQ_LEN, pad_token_id=PAD)
    discriminator = ElectraForPreTraining(disc_config)
    generator = ElectraForMaskedLM(gen_config)
    # share token, position and token-type embeddings (and the embedding LayerNorm)
    generator.electra.embeddings = discriminator.electra.embeddings
    generator.tie_weights()   # the generator's LM head stays tied to the shared word embeddings
    assert generator.generator_lm_head.weight is discriminator.electra.embeddings.word_embeddings.weight
    discriminator.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    params = {}
    for name, p in list(discriminator.named_parameters()) + list(generator.named_parameters()):
        params.setdefault(id(p), (name, p))
    decay = [p for n, p in params.values() if not (n.endswith("bias") or "LayerNorm" in n)]
    no_decay = [p for n, p in params.values() if n.endswith("bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=4e-3, betas=(0.9, 0.999), eps=1e-6)
    total_steps, batch_size = 50, 32
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=5,
                                                num_training_steps=total_steps)
    print(f"unique parameters {sum(p.numel() for _, p in params.values())}, "
          f"lr at step 0 = {scheduler.get_last_lr()[0]:.1e}")

    train_ids = make_markov_corpus(1600, seed=1)
    eval_ids = make_markov_corpus(128, seed=2)
    train_gen = torch.Generator().manual_seed(7)

    step = 0
    while step < total_steps:
        perm = torch.randperm(train_ids.size(0))
        for i in range(0, train_ids.size(0) - batch_size + 1, batch_size):
            loss, stats = electra_step(generator, discriminator, train_ids[perm[i:i + batch_size]], train_gen)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_([p for _, p in params.values()], 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
            if step % 10 == 0:
                print(f"step {step:3d} lr {scheduler.get_last_lr()[0]:.2e} loss {loss.item():.3f} "
                      f"gen {stats['gen_loss']:.3f} disc {stats['disc_loss']:.4f} "
                      f"grad_norm {grad_norm:.2f}")
            if step == total_steps // 2:
                ev = evaluate(generator, discriminator, eval_ids)
                print(f"[mid-run eval] gen_acc {ev['gen_acc']:.3f} disc_acc {ev['disc_acc']:.3f} "
                      f"replaced {ev['replaced_frac']:.3f}")
            if step >= total_steps:
                break

    ev = evaluate(generator, discriminator, eval_ids)
    print(f"[final eval] gen_loss {ev['gen_loss']:.3f} (uniform {math.log(VOCAB):.3f}) "
          f"gen_acc {ev['gen_acc']:.3f} disc_acc {ev['disc_acc']:.3f} replaced {ev['replaced_frac']:.3f}")


if __name__ == "__main__":
    main()
