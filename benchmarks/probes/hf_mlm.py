"""Healthy probe: Hugging Face masked-language-model pre-training in the style of examples/pytorch/language-modeling/run_mlm.py: a DistilBertForMaskedLM built from a tiny config, DataCollatorForLanguageModeling (mlm_probability=0.15, 80/10/10 masking) over a local word-level tokenizer, Trainer with eval_strategy="steps" every 3 steps, warmup_ratio, weight_decay, logging_steps=1 and no checkpoints.

The tokenizer is built in memory from a fixed vocabulary (nothing is downloaded); the
"text" is random token ids grouped into fixed-length blocks as run_mlm.py's group_texts does.
"""
import tempfile

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (DataCollatorForLanguageModeling, DistilBertConfig, DistilBertForMaskedLM,
                          PreTrainedTokenizerFast, Trainer, TrainingArguments)

SEED, VOCAB, BLOCK = 0, 96, 16
torch.manual_seed(SEED)

specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
vocab = {tok: i for i, tok in enumerate(specials)}
vocab.update({f"w{i}": len(specials) + i for i in range(VOCAB - len(specials))})
backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                    cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def grouped_blocks(n_blocks, seed):
    """A long random token stream cut into BLOCK-sized examples with [CLS] ... [SEP] framing."""
    g = torch.Generator().manual_seed(seed)
    stream = torch.randint(len(specials), VOCAB, (n_blocks * (BLOCK - 2),), generator=g).tolist()
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    return [{"input_ids": [cls] + stream[i:i + BLOCK - 2] + [sep],
             "special_tokens_mask": [1] + [0] * (BLOCK - 2) + [1]}
            for i in range(0, len(stream), BLOCK - 2)]


class Blocks(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


config = DistilBertConfig(vocab_size=VOCAB, max_position_embeddings=BLOCK, dim=32, n_layers=2, n_heads=4,
                          hidden_dim=64, dropout=0.1, attention_dropout=0.1, pad_token_id=tokenizer.pad_token_id)
model = DistilBertForMaskedLM(config)
collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=True, mlm_probability=0.15)

args = TrainingArguments(
    output_dir=tempfile.mkdtemp(), overwrite_output_dir=True, per_device_train_batch_size=8,
    per_device_eval_batch_size=16, max_steps=9, learning_rate=5e-4, weight_decay=0.01, warmup_ratio=0.2,
    eval_strategy="steps", eval_steps=3, save_strategy="no", logging_steps=1, report_to=[], use_cpu=True,
    seed=SEED, dataloader_num_workers=0)
trainer = Trainer(model=model, args=args, train_dataset=Blocks(grouped_blocks(64, 1)),
                  eval_dataset=Blocks(grouped_blocks(16, 2)), data_collator=collator)
trainer.train()
metrics = trainer.evaluate()
print(f"eval_loss {metrics['eval_loss']:.4f} perplexity {torch.exp(torch.tensor(metrics['eval_loss'])):.2f}")
