"""Instruction-style SFT of a small GPT-2 with NEFTune noise, bf16 autocast on CPU.

Modelled on: neelsjain/NEFTune (Jain et al., "NEFTune: Noisy Embeddings Improve
Instruction Finetuning", 2023) as integrated in the HF Trainer through
``TrainingArguments(neftune_noise_alpha=...)`` and described in the TRL SFTTrainer
docs ("Enhance the model's performances using NEFTune"): during training a forward
hook on the input embedding adds uniform noise scaled by ``alpha / sqrt(L * d)``;
prompt tokens are masked out of the loss (labels = -100) as in the Alpaca / TRL
"completion only" recipes. Here the "instruction" is: answer with the largest and
the smallest digit of the prompt, then EOS.

What is unusual about the loop (all intentional):
  * the embedding output is perturbed by a hook during training only (the Trainer
    removes the hook after ``train()``), so train and eval forward passes differ;
  * most label positions are -100 (prompt + padding), only the answer is trained;
  * bf16 autocast on CPU, gradient accumulation of 2 micro-batches, cosine schedule
    with warm-up; evaluation in the middle of training.
"""
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

torch.set_num_threads(1)

PAD, BOS, SEP, EOS = 0, 1, 2, 3
DIGITS = 10  # tokens 4..13
N_DIGITS = 6


class MaxMinTask(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.examples = []
        for _ in range(n):
            k = int(torch.randint(3, N_DIGITS + 1, (1,), generator=g))
            digits = torch.randint(4, 4 + DIGITS, (k,), generator=g).tolist()
            prompt = [BOS] + digits + [SEP]
            answer = [max(digits), min(digits), EOS]
            self.examples.append((prompt, answer))

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        prompt, answer = self.examples[i]
        ids = prompt + answer
        labels = [-100] * len(prompt) + answer
        return {"input_ids": ids, "labels": labels}


def collate(features):
    max_len = max(len(f["input_ids"]) for f in features)
    ids, labels, mask = [], [], []
    for f in features:
        pad = max_len - len(f["input_ids"])
        ids.append(f["input_ids"] + [PAD] * pad)
        labels.append(f["labels"] + [-100] * pad)
        mask.append([1] * len(f["input_ids"]) + [0] * pad)
    return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels),
            "attention_mask": torch.tensor(mask)}


@torch.no_grad()
def exact_match(model, dataset, n=64):
    model.eval()
    hits = 0
    for prompt, answer in dataset.examples[:n]:
        ids = torch.tensor([prompt])
        for _ in range(len(answer)):
            nxt = model(input_ids=ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
        hits += ids[0, len(prompt):].tolist() == answer
    return hits / n


def main():
    set_seed(0)
    config = GPT2Config(vocab_size=4 + DIGITS, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    model = GPT2LMHeadModel(config)
    train_ds, eval_ds = MaxMinTask(2000, seed=1), MaxMinTask(200, seed=2)

    with tempfile.TemporaryDirectory() as out_dir:
        args = TrainingArguments(
            output_dir=out_dir,
            per_device_train_batch_size=16,
            gradient_accumulation_steps=2,
            per_device_eval_batch_size=64,
            learning_rate=5e-3,
            weight_decay=0.0,
            lr_scheduler_type="cosine",
            warmup_ratio=0.1,
            max_steps=60,
            bf16=True,
            neftune_noise_alpha=5.0,
            eval_strategy="steps",
            eval_steps=20,
            logging_steps=10,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
        )
        trainer = Trainer(model=model, args=args, train_dataset=train_ds,
                          eval_dataset=eval_ds, data_collator=collate)
        trainer.train()
        hooked = model.get_input_embeddings()._forward_hooks
        print(f"embedding hooks after train(): {len(hooked)}")
        print(f"exact match on eval prompts: {exact_match(model, eval_ds):.3f}")


if __name__ == "__main__":
    main()
