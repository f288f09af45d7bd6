"""BART denoising pre-training (text infilling) with LayerDrop, then pruning to half depth.

Modelled on: facebookresearch/fairseq ``examples/layerdrop/README.md`` (Fan, Grave & Joulin,
"Reducing Transformer Depth on Demand with Structured Dropout", ICLR 2020: train with
``--encoder-layerdrop/--decoder-layerdrop``, then prune at inference time with
``--encoder-layers-to-keep 0,2,...``), using the Hugging Face BART implementation
(``BartConfig(encoder_layerdrop=..., decoder_layerdrop=...)``) and the BART text-infilling
noise (Lewis et al., 2020; fairseq ``denoising_dataset.py``: Poisson(3) span lengths, each
span replaced by a single ``<mask>``), trained with the HF ``Trainer``.

What is unusual about the run (deliberate):
  * LayerDrop skips whole encoder/decoder layers at random during training, so on many
    steps some layers' parameters receive no gradient at all (their ``.grad`` is None and
    AdamW leaves them untouched that step).
  * Evaluation happens in the middle of training (``eval_strategy="steps"``).
  * After training, every other layer is removed from the encoder and decoder
    ("every-other-layer" pruning from the paper) *without retraining*, and the pruned model is
    evaluated again through the same Trainer.
  * Noising is done on the fly in the collator, so each epoch sees different masks.
"""
import tempfile

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import Dataset
from transformers import BartConfig, BartForConditionalGeneration, Trainer, TrainingArguments, set_seed

torch.set_num_threads(1)

BOS, PAD, EOS, MASK = 0, 1, 2, 3
N_SPECIAL, N_WORDS = 4, 96
VOCAB = N_SPECIAL + N_WORDS


def make_sentences(n, rng):
    """Toy 'language': noun phrases and verb phrases drawn from a small grammar."""
    det, noun, verb, adj = (np.arange(4, 10), np.arange(10, 40), np.arange(40, 70), np.arange(70, 100))
    sents = []
    for _ in range(n):
        s = []
        for _ in range(rng.integers(2, 4)):
            s += [rng.choice(det)] + ([rng.choice(adj)] if rng.random() < 0.5 else []) + [rng.choice(noun)]
            s += [rng.choice(verb)]
        s += [rng.choice(det), rng.choice(noun)]
        sents.append([BOS] + [int(t) for t in s] + [EOS])
    return sents


class SentenceDataset(Dataset):
    def __init__(self, sents):
        self.sents = sents

    def __len__(self):
        return len(self.sents)

    def __getitem__(self, i):
        return {"tokens": self.sents[i]}


class TextInfillingCollator:
    """BART text infilling: mask ~30% of tokens in Poisson(3) spans, one <mask> per span."""

    def __init__(self, mask_ratio=0.3, poisson_lambda=3.0):
        self.mask_ratio, self.lam = mask_ratio, poisson_lambda

    def noise(self, toks):
        body = toks[1:-1]
        n_mask = int(round(len(body) * self.mask_ratio))
        out, i, masked = [], 0, 0
        while i < len(body):
            if masked < n_mask and torch.rand(()) < self.mask_ratio:
                span = int(torch.poisson(torch.tensor(self.lam)).item())
                span = min(span, n_mask - masked, len(body) - i)
                out.append(MASK)  # a zero-length span inserts a <mask>
                masked += span
                i += span
                if span == 0:
                    out.append(body[i])
                    i += 1
            else:
                out.append(body[i])
                i += 1
        return [BOS] + out + [EOS]

    def __call__(self, features):
        srcs = [self.noise(f["tokens"]) for f in features]
        tgts = [f["tokens"] for f in features]
        ls, lt = max(map(len, srcs)), max(map(len, tgts))
        input_ids = torch.full((len(srcs), ls), PAD)
        attn = torch.zeros((len(srcs), ls), dtype=torch.long)
        labels = torch.full((len(tgts), lt), -100)
        for i, (s, t) in enumerate(zip(srcs, tgts)):
            input_ids[i, :len(s)] = torch.tensor(s)
            attn[i, :len(s)] = 1
            labels[i, :len(t)] = torch.tensor(t)
        return {"input_ids": input_ids, "attention_mask": attn, "labels": labels}


def prune_every_other_layer(model):
    """fairseq --encoder-layers-to-keep 0,2,.. / --decoder-layers-to-keep 0,2,.."""
    for stack, key in ((model.model.encoder, "encoder_layers"), (model.model.decoder, "decoder_layers")):
        keep = list(range(0, len(stack.layers), 2))
        stack.layers = nn.ModuleList([stack.layers[i] for i in keep])
        setattr(model.config, key, len(keep))
    return model


def main():
    set_seed(0)
    rng = np.random.default_rng(0)
    train_ds = SentenceDataset(make_sentences(1200, rng))
    eval_ds = SentenceDataset(make_sentences(160, rng))

    config = BartConfig(
        vocab_size=VOCAB, d_model=64, encoder_layers=4, decoder_layers=4,
        encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
        dropout=0.1, encoder_layerdrop=0.25, decoder_layerdrop=0.25,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=EOS,
        forced_eos_token_id=EOS)
    model = BartForConditionalGeneration(config)
    print(f"params: {sum(p.numel() for p in model.parameters()) / 1e3:.1f}k")

    with tempfile.TemporaryDirectory() as out_dir:
        args = TrainingArguments(
            output_dir=out_dir, max_steps=60, per_device_train_batch_size=32, per_device_eval_batch_size=80,
            learning_rate=2e-3, weight_decay=0.01, warmup_ratio=0.1, lr_scheduler_type="polynomial",
            max_grad_norm=1.0, eval_strategy="steps", eval_steps=20, logging_steps=10,
            save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
            remove_unused_columns=False)
        trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                          data_collator=TextInfillingCollator())
        trainer.train()

        torch.manual_seed(123)  # same noise for both evaluations
        full = trainer.evaluate()
        prune_every_other_layer(trainer.model)
        torch.manual_seed(123)
        pruned = trainer.evaluate()
        print(f"eval loss full depth (4+4 layers): {full['eval_loss']:.4f}")
        print(f"eval loss pruned   (2+2 layers): {pruned['eval_loss']:.4f}  (no retraining)")
        print(f"params after pruning: {sum(p.numel() for p in trainer.model.parameters()) / 1e3:.1f}k")


if __name__ == "__main__":
    main()
