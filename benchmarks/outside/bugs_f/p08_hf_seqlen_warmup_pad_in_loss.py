"""Custom causal-LM ``compute_loss`` that scores padding once batches start to pad (HF Trainer).

Bug class: data pipeline / loss masking (padding positions counted as targets
in the loss).

Modelled on: state-spaces/mamba#24 (the ``MambaTrainer`` shared in that thread
overrides ``Trainer.compute_loss`` and builds the labels from ``input_ids``,
so the collator's ``-100`` padding labels are thrown away and the model is
trained to predict padding); same mistake fixed in huggingface/trl PR #1625
("[ORPO] Correct label mask for pad tokens": labels copied from input_ids
without masking pad tokens).  The training run here uses sequence-length
warm-up (short truncated sequences first, as in curriculum / seqlen-warmup
recipes), so batches contain no padding at first.

What goes wrong: during the warm-up every example is truncated to 16 tokens and
batches are dense, so the custom loss is correct.  From the end of the warm-up
on, examples keep their natural length (20-40 tokens) and are right-padded to
the longest one in the batch; the custom ``compute_loss`` shifts ``input_ids``
into labels, so every pad position becomes a target.  A sizeable share of the
loss and gradient now goes into predicting padding after EOS (easy, so the loss
looks fine).

Healthy twin: labels are the collator's ``labels`` (pad positions set to
-100), i.e. the fix from the thread.

Onset: the collator truncates its first 20 batches (steps 0-19); batch 20 is
the first padded one and is used by optimizer step K = 20 (of 60).
"""
import sys
import tempfile

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
N_SPECIAL = 3
VOCAB = 48
N_EXAMPLES = 160
BATCH = 8
WARMUP_BATCHES = 20
WARMUP_LEN = 16


def build_examples(n, gen):
    """Cyclic token runs of length 20..40 framed by BOS/EOS."""
    out = []
    n_words = VOCAB - N_SPECIAL
    for _ in range(n):
        length = int(torch.randint(18, 39, (1,), generator=gen))
        start = int(torch.randint(0, n_words, (1,), generator=gen))
        stride = int(torch.randint(1, 5, (1,), generator=gen))
        body = (start + stride * torch.arange(length)) % n_words + N_SPECIAL
        out.append(torch.cat([torch.tensor([BOS_ID]), body, torch.tensor([EOS_ID])]))
    return out


class ListDataset(torch.utils.data.Dataset):
    def __init__(self, seqs):
        self.seqs = seqs

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return {"input_ids": self.seqs[i]}


class SeqLenWarmupCollator:
    """Truncates to WARMUP_LEN for the first WARMUP_BATCHES batches, then pads dynamically."""

    def __init__(self):
        self.n_batches = 0

    def __call__(self, features):
        seqs = [f["input_ids"] for f in features]
        if self.n_batches < WARMUP_BATCHES:
            seqs = [s[:WARMUP_LEN] for s in seqs]
        self.n_batches += 1
        width = max(len(s) for s in seqs)
        input_ids = torch.full((len(seqs), width), PAD_ID)
        attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            input_ids[i, :len(s)] = s
            attention_mask[i, :len(s)] = 1
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class CausalLMTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        input_ids = inputs["input_ids"]
        labels = inputs["labels"]
        logits = model(input_ids=input_ids, attention_mask=inputs["attention_mask"]).logits
        if HEALTHY:
            targets = labels[:, 1:]
        else:
            targets = input_ids[:, 1:]  # BUG: pad positions become targets
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), targets.reshape(-1),
                               ignore_index=-100)
        return (loss, logits) if return_outputs else loss


class WarmupEnd(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == WARMUP_BATCHES:
            print(f"sequence-length warm-up over at step {state.global_step}")
            if not HEALTHY:
                print(f"ONSET step {state.global_step}")


config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                     pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID)
model = LlamaForCausalLM(config)
train_ds = ListDataset(build_examples(N_EXAMPLES, torch.Generator().manual_seed(11)))

with tempfile.TemporaryDirectory() as tmp:
    args = TrainingArguments(
        output_dir=tmp,
        per_device_train_batch_size=BATCH,
        num_train_epochs=3,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        weight_decay=0.0,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )
    trainer = CausalLMTrainer(model=model, args=args, train_dataset=train_ds,
                              data_collator=SeqLenWarmupCollator(), callbacks=[WarmupEnd()])
    result = trainer.train()
    print(f"final train_loss {result.training_loss:.4f}")

print("done")
