"""CTC speech recognition with a small Wav2Vec2ForCTC trained by the HF Trainer.

Modelled on: huggingface/transformers
``examples/pytorch/speech-recognition/run_speech_recognition_ctc.py``: a vocab.json is
built from the transcripts and turned into a ``Wav2Vec2CTCTokenizer`` + feature
extractor + ``Wav2Vec2Processor``; ``DataCollatorCTCWithPadding`` pads audio and
labels (label padding -> -100); ``model.freeze_feature_encoder()``;
``gradient_checkpointing=True`` and ``group_by_length=True`` in ``TrainingArguments``;
a CER metric in ``compute_metrics``. The "audio" is synthetic: every character is
a short tone burst of its own frequency.

What is unusual about the loop (all intentional):
  * the whole convolutional feature encoder is frozen: its parameters never receive
    gradients and never change while the rest of the model trains;
  * LayerDrop (``layerdrop=0.2``) skips whole transformer layers at random per step,
    so some layers get no gradient at some steps;
  * SpecAugment-style time masking replaces random frames by a learned mask vector;
  * gradient checkpointing recomputes the encoder layers in the backward pass
    (non-reentrant, so the frozen conv layers with grad-free audio input are fine);
  * 80 steps is short for CTC trained from scratch: the loss falls from ~7 to ~2.4
    while the model is still in CTC's usual blank-dominated phase (CER stays ~1.0).
"""
import json
import os
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import (
    Trainer,
    TrainingArguments,
    Wav2Vec2Config,
    Wav2Vec2CTCTokenizer,
    Wav2Vec2FeatureExtractor,
    Wav2Vec2ForCTC,
    Wav2Vec2Processor,
    set_seed,
)

torch.set_num_threads(1)

SR = 16000
CHARS = list("abcdefgh")


class ToneSpeech(Dataset):
    def __init__(self, n, processor, seed):
        rng = np.random.default_rng(seed)
        self.items = []
        freqs = {c: 1000.0 + 800.0 * i for i, c in enumerate(CHARS)}
        for _ in range(n):
            text = "".join(rng.choice(CHARS, size=rng.integers(3, 7)))
            pieces = []
            for c in text:
                dur = int(rng.integers(320, 480))
                t = np.arange(dur) / SR
                pieces.append(np.sin(2 * np.pi * freqs[c] * t) * np.hanning(dur))
                pieces.append(np.zeros(int(rng.integers(80, 160))))
            audio = np.concatenate(pieces) + 0.05 * rng.standard_normal(sum(map(len, pieces)))
            inputs = processor(audio.astype(np.float32), sampling_rate=SR)
            self.items.append({"input_values": inputs.input_values[0],
                               "labels": processor.tokenizer(text).input_ids,
                               "text": text})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        item = self.items[i]
        return {"input_values": item["input_values"], "labels": item["labels"]}


@dataclass
class DataCollatorCTCWithPadding:
    processor: Wav2Vec2Processor
    padding: bool = True

    def __call__(self, features):
        input_features = [{"input_values": f["input_values"]} for f in features]
        label_features = [{"input_ids": f["labels"]} for f in features]
        batch = self.processor.pad(input_features, padding=self.padding, return_tensors="pt")
        labels_batch = self.processor.pad(labels=label_features, padding=self.padding,
                                          return_tensors="pt")
        labels = labels_batch["input_ids"].masked_fill(labels_batch.attention_mask.ne(1), -100)
        batch["labels"] = labels
        return batch


def edit_distance(a, b):
    d = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, cb in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (ca != cb))
    return d[len(b)]


def main():
    set_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        vocab = {"[PAD]": 0, "[UNK]": 1, "|": 2}
        vocab.update({c: i + 3 for i, c in enumerate(CHARS)})
        vocab_file = os.path.join(tmp, "vocab.json")
        with open(vocab_file, "w") as f:
            json.dump(vocab, f)
        tokenizer = Wav2Vec2CTCTokenizer(vocab_file, unk_token="[UNK]", pad_token="[PAD]",
                                         word_delimiter_token="|")
        feature_extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=SR,
                                                     padding_value=0.0, do_normalize=True,
                                                     return_attention_mask=True)
        processor = Wav2Vec2Processor(feature_extractor=feature_extractor, tokenizer=tokenizer)

        config = Wav2Vec2Config(
            vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
            hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
            conv_dim=(32, 32, 32), conv_stride=(5, 4, 4), conv_kernel=(10, 4, 4),
            feat_extract_norm="layer", do_stable_layer_norm=True,
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
            mask_time_prob=0.05, mask_time_length=2, layerdrop=0.2,
            ctc_loss_reduction="mean", ctc_zero_infinity=True,
            hidden_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0,
        )
        model = Wav2Vec2ForCTC(config)
        model.freeze_feature_encoder()

        train_ds = ToneSpeech(320, processor, seed=1)
        eval_ds = ToneSpeech(48, processor, seed=2)

        def compute_metrics(pred):
            pred_ids = np.argmax(pred.predictions, axis=-1)
            label_ids = pred.label_ids.copy()
            label_ids[label_ids == -100] = tokenizer.pad_token_id
            hyps = processor.batch_decode(pred_ids)
            refs = processor.batch_decode(label_ids, group_tokens=False)
            errs = sum(edit_distance(h, r) for h, r in zip(hyps, refs))
            return {"cer": errs / max(1, sum(len(r) for r in refs))}

        args = TrainingArguments(
            output_dir=os.path.join(tmp, "out"),
            per_device_train_batch_size=8,
            per_device_eval_batch_size=16,
            group_by_length=True,
            gradient_checkpointing=True,
            gradient_checkpointing_kwargs={"use_reentrant": False},
            learning_rate=3e-3,
            warmup_steps=8,
            max_steps=80,
            weight_decay=0.005,
            eval_strategy="steps",
            eval_steps=40,
            logging_steps=20,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
        )
        trainer = Trainer(
            model=model,
            args=args,
            data_collator=DataCollatorCTCWithPadding(processor=processor),
            train_dataset=train_ds,
            eval_dataset=eval_ds,
            compute_metrics=compute_metrics,
            processing_class=processor,
        )
        trainer.train()
        print(trainer.evaluate())


if __name__ == "__main__":
    main()
