"""P09 (class: reentrant gradient checkpointing + frozen input embeddings -- once the embeddings are frozen the
checkpointed transformer blocks receive no gradients at all; only the modules outside the checkpoints keep
training) -- HuggingFace Trainer.

Modelled on huggingface/transformers#21381 "gradient checkpointing disables requires_grad when freezing part of
models (fix with use_reentrant=False)" and #23170 "Gradient Checkpointing Fails with frozen parameters": with
`gradient_checkpointing=True` (transformers defaults to `use_reentrant=True`) and the first parameters (the
embeddings) frozen, the hidden states entering each checkpointed block do not require grad, so torch's
reentrant checkpoint returns outputs with no grad path and the blocks' parameters get `grad=None`
(torch only emits a "None of the inputs have requires_grad=True" UserWarning).  The standard remedy is
`model.enable_input_require_grads()` (transformers PR #21598) or `use_reentrant=False`.

Program: a small GPT-2 causal LM trained with `Trainer(gradient_checkpointing=True, bf16=True)` on synthetic
Markov-chain token streams; a FreezeEmbeddingsCallback freezes wte/wpe after step 12 ("stabilise the token
embeddings after warm-up").  From optimizer step 12 on, every transformer block silently stops training --
only ln_f and the (untied) lm_head still update.  Healthy twin: the callback also calls
`model.enable_input_require_grads()`.
"""
import argparse
import logging
import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.utils import logging as hf_logging

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
parser.add_argument("--freeze-at", type=int, default=12)
args = parser.parse_args()
HEALTHY = args.healthy
hf_logging.set_verbosity_error()
logging.getLogger("accelerate").setLevel(logging.ERROR)
set_seed(0)

VOCAB, SEQ_LEN = 96, 32
g0 = torch.Generator().manual_seed(17)
# sparse Markov chain: each token has 3 preferred successors
successors = torch.randint(0, VOCAB, (VOCAB, 3), generator=g0)


class MarkovLM(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        seqs = torch.empty(n, SEQ_LEN, dtype=torch.long)
        seqs[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
        for t in range(1, SEQ_LEN):
            choice = torch.randint(0, 3, (n,), generator=g)
            nxt = successors[seqs[:, t - 1], choice]
            noise = torch.rand(n, generator=g) < 0.1
            seqs[:, t] = torch.where(noise, torch.randint(0, VOCAB, (n,), generator=g), nxt)
        self.seqs = seqs

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        ids = self.seqs[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=64, n_layer=3, n_head=2, n_inner=128,
                    tie_word_embeddings=False, use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = GPT2LMHeadModel(config)


class FreezeEmbeddingsCallback(TrainerCallback):
    def __init__(self, freeze_at):
        self.freeze_at = freeze_at

    def on_step_begin(self, args, state, control, **kwargs):
        if not HEALTHY and state.global_step == self.freeze_at:
            print(f"ONSET step {state.global_step}")

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step != self.freeze_at:
            return
        model.get_input_embeddings().requires_grad_(False)
        model.transformer.wpe.requires_grad_(False)
        if HEALTHY:
            model.enable_input_require_grads()  # keep a grad path into the checkpointed blocks
        n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
        print(f"[callback] step {state.global_step}: froze token/position embeddings; "
              f"{n_train} parameters still trainable")


training_args = TrainingArguments(
    output_dir="p09_out", max_steps=36, per_device_train_batch_size=16, per_device_eval_batch_size=64,
    learning_rate=3e-3, weight_decay=0.01, warmup_steps=4, lr_scheduler_type="linear", max_grad_norm=1.0,
    gradient_checkpointing=True, bf16=True, use_cpu=True, eval_strategy="steps", eval_steps=12,
    logging_steps=4, save_strategy="steps", save_steps=36, save_total_limit=1, save_only_model=True,
    report_to="none", seed=0, disable_tqdm=True, dataloader_num_workers=0,
)
trainer = Trainer(model=model, args=training_args, train_dataset=MarkovLM(36 * 16, seed=1),
                  eval_dataset=MarkovLM(128, seed=2), callbacks=[FreezeEmbeddingsCallback(args.freeze_at)])
trainer.train()
metrics = trainer.evaluate()
print(f"final eval_loss {metrics['eval_loss']:.4f} perplexity {torch.exp(torch.tensor(metrics['eval_loss'])):.2f}")
