"""Single-device full fine-tune (SFT) of a tiny Llama on an instruction dataset,
written as a torchtune-style recipe class (setup / train / cleanup), with
gradient accumulation over several epochs.

Modelled on: meta-pytorch/torchtune PR #2745 "Fixing counting number of batches
for accumulation through epoch".  The recipes decide when to step with
``if (idx + 1) % gradient_accumulation_steps == 0`` where ``idx`` is the batch
index *inside the current epoch*.  When the number of batches per epoch is not
a multiple of the accumulation steps, the last micro-batches of an epoch are
backpropagated but never stepped; their gradients stay in ``.grad`` and are
silently added to the first optimizer step of the next epoch (the reporter saw
accumulation over 15 micro-batches instead of 8, and a loss drop / >100 %
accuracy at epoch boundaries).  The fix counts micro-batches through the
epochs, so every optimizer step accumulates exactly
``gradient_accumulation_steps`` micro-batches.

Unusual about the loop: prompt tokens are masked with -100; loss is divided by
the accumulation steps before backward; cosine schedule with warm-up from
transformers stepped per optimizer step; bf16 autocast on CPU.
Run: python p03_llama_sft_grad_accum_epoch_carryover.py [--healthy]
"""
import argparse

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import LlamaConfig, LlamaForCausalLM, get_cosine_schedule_with_warmup

torch.set_num_threads(1)
IGNORE = -100


class InstructDataset(Dataset):
    """prompt: a list of digits plus an op token; answer: the op applied to the digits."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.samples = []
        for _ in range(n):
            L = int(torch.randint(3, 7, (1,), generator=g))
            digits = torch.randint(10, 20, (L,), generator=g).tolist()
            op = int(torch.randint(0, 2, (1,), generator=g))
            answer = sorted(digits) if op == 0 else digits[::-1]
            prompt = [1] + digits + [3 + op, 5]   # BOS digits OP SEP
            tokens = prompt + answer + [2]        # ... EOS
            labels = [IGNORE] * len(prompt) + answer + [2]
            self.samples.append((tokens, labels))

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def padded_collate_sft(batch, pad_id=0):
    T = max(len(t) for t, _ in batch)
    tokens = torch.full((len(batch), T), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), T), IGNORE, dtype=torch.long)
    for i, (t, l) in enumerate(batch):
        tokens[i, :len(t)] = torch.tensor(t)
        labels[i, :len(l)] = torch.tensor(l)
    return {"tokens": tokens, "labels": labels}


class FullFinetuneRecipeSingleDevice:
    def __init__(self, cfg):
        self.cfg = cfg
        self.global_step = 0
        self._micro_in_window = 0
        self._micro_counts = []
        self._grad_norms = []
        self._reported = False

    def setup(self):
        torch.manual_seed(self.cfg["seed"])
        config = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                             eos_token_id=2)
        self._model = LlamaForCausalLM(config)
        self._optimizer = torch.optim.AdamW(self._model.parameters(), lr=self.cfg["lr"],
                                            weight_decay=0.01)
        ds = InstructDataset(self.cfg["n_samples"], seed=1)
        self._dataloader = DataLoader(ds, batch_size=self.cfg["batch_size"], shuffle=True,
                                      collate_fn=padded_collate_sft,
                                      generator=torch.Generator().manual_seed(0))
        self._steps_per_epoch = len(self._dataloader) // self.cfg["gradient_accumulation_steps"]
        total = self._steps_per_epoch * self.cfg["epochs"]
        self._lr_scheduler = get_cosine_schedule_with_warmup(self._optimizer, 3, total)
        self._loss_fn = torch.nn.CrossEntropyLoss(ignore_index=IGNORE)

    def _loss_step(self, batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = self._model(input_ids=batch["tokens"]).logits
        logits = logits[:, :-1].float().reshape(-1, logits.size(-1))
        labels = batch["labels"][:, 1:].reshape(-1)
        return self._loss_fn(logits, labels)

    def train(self):
        ga = self.cfg["gradient_accumulation_steps"]
        self._optimizer.zero_grad()
        running_idx = 0
        for curr_epoch in range(self.cfg["epochs"]):
            for idx, batch in enumerate(self._dataloader):
                self._model.train()
                loss = self._loss_step(batch) / ga
                loss.backward()
                self._micro_in_window += 1
                counter = running_idx if self.cfg["count_through_epochs"] else idx
                running_idx += 1
                if (counter + 1) % ga == 0:
                    if (not self.cfg["count_through_epochs"] and self._micro_in_window != ga
                            and not self._reported):
                        print(f"ONSET step {self.global_step}")
                        self._reported = True
                    gn = torch.nn.utils.clip_grad_norm_(self._model.parameters(), float("inf"))
                    self._grad_norms.append(gn.item())
                    self._micro_counts.append(self._micro_in_window)
                    self._optimizer.step()
                    self._optimizer.zero_grad(set_to_none=True)
                    self._lr_scheduler.step()
                    self._micro_in_window = 0
                    self.global_step += 1
                    if self.global_step % 5 == 0:
                        print(f"epoch {curr_epoch} step {self.global_step:3d} "
                              f"loss {loss.item() * ga:.4f} lr {self._lr_scheduler.get_last_lr()[0]:.2e}")
                if self.global_step >= self.cfg["max_steps"]:
                    return

    def cleanup(self):
        counts = self._micro_counts
        first_epoch_end = self._steps_per_epoch
        print(f"EVIDENCE micro-batches in step {first_epoch_end}={counts[first_epoch_end]} "
              f"(expected {self.cfg['gradient_accumulation_steps']}) | max micro-batches per step="
              f"{max(counts)} | grad-norm ratio step{first_epoch_end}/step{first_epoch_end - 1}="
              f"{self._grad_norms[first_epoch_end] / self._grad_norms[first_epoch_end - 1]:.2f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true")
    args = parser.parse_args()
    cfg = dict(seed=0, lr=2e-3, n_samples=30 * 16, batch_size=16, gradient_accumulation_steps=4,
               epochs=4, max_steps=30, count_through_epochs=args.healthy)
    recipe = FullFinetuneRecipeSingleDevice(cfg)
    recipe.setup()
    recipe.train()
    recipe.cleanup()


if __name__ == "__main__":
    main()
