"""Fine-tuning a BERT sentence classifier with Mixout (HF Trainer), after a short MLM pre-train.

Modelled on: bloodwass/mixout (``mixout/mixout.py`` -- the ``Mixout`` autograd Function --,
``mixout/mixlinear.py`` -- ``MixLinear`` -- and ``example_huggingface.py``, which walks
``model.named_modules()``, turns every ``nn.Dropout`` into ``Dropout(0)`` and every ``nn.Linear``
into a ``MixLinear`` whose target is a copy of the pretrained weight); Lee, Cho & Kang,
"Mixout: Effective Regularization to Finetune Large-scale Pretrained Language Models", ICLR 2020.

Stage 1 trains a word-level tokenizer and a tiny BERT from a config with masked-LM
(``DataCollatorForLanguageModeling``) and saves it -- the stand-in for a downloaded checkpoint.
Stage 2 reloads it as ``BertForSequenceClassification`` (new, randomly initialised head) and
fine-tunes on an SST-2-like sentiment task with the HF ``Trainer``.

What is unusual about the run (deliberate):
  * A custom ``torch.autograd.Function``: in training, each Linear's weight is replaced
    column-wise, with probability p = 0.7, by the frozen *pretrained* weight, and rescaled so the
    expectation equals the current weight; its backward passes ``grad * mask / (1 - p)``, so on
    each step most input columns of every weight matrix get exactly zero gradient.
  * All dropout layers are switched off (p = 0); mixout is the only stochastic regulariser.
  * The pretrained targets are non-trainable buffers kept alongside the trainable weights.
  * Two Trainers / two optimizers / two different model classes over one set of weights.
"""
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (BertConfig, BertForMaskedLM, BertForSequenceClassification,
                          DataCollatorForLanguageModeling, DataCollatorWithPadding, PreTrainedTokenizerFast,
                          Trainer, TrainingArguments, set_seed)

torch.set_num_threads(1)
N_WORDS = 80  # w0..w39 and their "synonyms" w40..w79


class Mixout(torch.autograd.Function):
    """[(1 - m) * target + m * input - p * target] / (1 - p), m ~ Bernoulli(1 - p) per input column."""

    @staticmethod
    def forward(ctx, input, target, p, training):
        ctx.p, ctx.training = p, training
        if p == 0 or not training:
            ctx.noise = None
            return input.clone()
        noise = input.new_empty(input.size(1)).bernoulli_(1 - p).expand_as(input)
        ctx.save_for_backward(noise)
        ctx.noise = True
        return ((1 - noise) * target + noise * input - p * target) / (1 - p)

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.noise is None:
            return grad_output, None, None, None
        (noise,) = ctx.saved_tensors
        return grad_output * noise / (1 - ctx.p), None, None, None


class MixLinear(nn.Linear):
    def __init__(self, in_features, out_features, bias, target, p):
        super().__init__(in_features, out_features, bias)
        self.register_buffer("target", target.detach().clone(), persistent=False)
        self.p = p

    def forward(self, input):
        return F.linear(input, Mixout.apply(self.weight, self.target, self.p, self.training), self.bias)

    def extra_repr(self):
        return f"mixout={self.p}, " + super().extra_repr()


def replace_layer_for_mixout(module, mixout_prob):
    if isinstance(module, nn.Dropout):
        return nn.Dropout(0)
    if isinstance(module, nn.Linear):
        new_module = MixLinear(module.in_features, module.out_features, module.bias is not None,
                               module.weight, mixout_prob)
        new_module.load_state_dict(module.state_dict())
        return new_module
    return module


def recursive_setattr(obj, attr, value):
    attr = attr.split(".", 1)
    if len(attr) == 1:
        setattr(obj, attr[0], value)
    else:
        recursive_setattr(getattr(obj, attr[0]), attr[1], value)


def build_tokenizer():
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                                         [f"w{i}" for i in range(N_WORDS)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def sentence(rng, n=10):
    return [int(w) for w in rng.integers(0, 40, size=n)]


def paraphrase(s, rng):
    out = [w + 40 if rng.random() < 0.4 else w for w in s]  # synonym substitution
    i = int(rng.integers(len(out) - 1))
    out[i], out[i + 1] = out[i + 1], out[i]  # a local reordering
    return out


def words(s):
    return " ".join(f"w{w}" for w in s)


class EncodedDataset(Dataset):
    def __init__(self, encodings, labels=None):
        self.enc, self.labels = encodings, labels

    def __len__(self):
        return len(self.enc["input_ids"])

    def __getitem__(self, i):
        item = {k: v[i] for k, v in self.enc.items()}
        if self.labels is not None:
            item["labels"] = self.labels[i]
        return item


POSITIVE = set(range(0, 8)) | set(range(40, 48))    # opinion words and their synonyms
NEGATIVE = set(range(8, 16)) | set(range(48, 56))


def make_sentiment(n, rng, tok):
    """SST-2-like: label 1 if the sentence has more positive than negative opinion words."""
    texts, y = [], []
    while len(texts) < n:
        s = paraphrase(sentence(rng), rng)
        score = sum(w in POSITIVE for w in s) - sum(w in NEGATIVE for w in s)
        if score == 0:
            continue
        texts.append(words(s))
        y.append(int(score > 0))
    return EncodedDataset(tok(texts), y)


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def main():
    set_seed(42)
    rng = np.random.default_rng(42)
    tok = build_tokenizer()
    common = dict(save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=42, logging_steps=10)
    with tempfile.TemporaryDirectory() as tmp:
        # ---- stage 1: masked-LM pre-training (stands in for a downloaded checkpoint)
        config = BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=128, max_position_embeddings=64, pad_token_id=tok.pad_token_id)
        mlm = BertForMaskedLM(config)
        corpus = [words(s) + " " + words(paraphrase(s, rng)) for s in (sentence(rng) for _ in range(1500))]
        Trainer(model=mlm, args=TrainingArguments(output_dir=f"{tmp}/mlm", max_steps=20, learning_rate=2e-3,
                                                   per_device_train_batch_size=50, warmup_steps=3, **common),
                train_dataset=EncodedDataset(tok(corpus)),
                data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=0.15)).train()
        mlm.save_pretrained(f"{tmp}/bert-tiny")
        tok.save_pretrained(f"{tmp}/bert-tiny")

        # ---- stage 2: fine-tuning with mixout(w_pretrained, p=0.7)
        model = BertForSequenceClassification.from_pretrained(f"{tmp}/bert-tiny", num_labels=2)
        for name, module in tuple(model.named_modules()):
            if name:
                recursive_setattr(model, name, replace_layer_for_mixout(module, mixout_prob=0.7))
        n_mix = sum(isinstance(m, MixLinear) for m in model.modules())
        print(f"MixLinear layers: {n_mix}; dropout layers now at p=0: "
              f"{sum(isinstance(m, nn.Dropout) and m.p == 0 for m in model.modules())}")

        train_ds, eval_ds = make_sentiment(1280, rng, tok), make_sentiment(300, rng, tok)
        args = TrainingArguments(output_dir=f"{tmp}/ft", max_steps=55, learning_rate=2e-3,
                                 per_device_train_batch_size=32, per_device_eval_batch_size=100,
                                 weight_decay=0.01, warmup_ratio=0.1, eval_strategy="steps", eval_steps=20,
                                 **common)
        trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                          data_collator=DataCollatorWithPadding(tok), compute_metrics=compute_metrics)
        trainer.train()
        layer = model.bert.encoder.layer[0].attention.self.query
        drift = (layer.weight - layer.target).norm() / layer.target.norm()
        print(f"relative drift of layer-0 query weight from its pretrained value: {drift.item():.4f}")
        print(trainer.evaluate())


if __name__ == "__main__":
    main()
