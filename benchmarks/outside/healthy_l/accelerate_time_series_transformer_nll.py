"""Probabilistic forecasting with TimeSeriesTransformerForPrediction, trained with accelerate.

Modelled on: the Hugging Face blog post "Probabilistic Time Series Forecasting with
Transformers" (https://huggingface.co/blog/time-series-transformers): a
``TimeSeriesTransformerConfig`` with ``lags_sequence``, time features and a static categorical
(series id) embedding; training windows of ``context_length + max(lags)`` past values plus
``prediction_length`` future values; the model's ``loss`` is the negative log-likelihood of a
Student-t distribution head; the blog's accelerate loop (``Accelerator()``, ``prepare``,
``accelerator.backward``, AdamW(betas=(0.9, 0.95), weight_decay=1e-1); lr raised from the
blog's 6e-4 to 2e-3 for this 40-update run) and
``model.generate`` sampling ``num_parallel_samples`` paths whose median is scored (MASE).  The
series are synthetic (weekly seasonality, trend, noise) with a few missing values, which the
blog handles with ``past_observed_mask``.

Unusual (but intended) things about the loop:
* the training loss is a Student-t negative log-likelihood in the data's own units (the mean
  scaler's log-scale enters it), so its level depends on the series magnitudes and it falls
  slowly; it is not comparable with an MSE;
* missing observations are zero-filled and masked out with ``past_observed_mask`` /
  ``future_observed_mask`` (zeros in the input are not data);
* gradient accumulation with ``accelerator.accumulate`` (2 micro-batches), clipping only on
  sync steps, warm-up from lr 0 with a cosine schedule prepared by accelerate;
* evaluation every 15 optimizer steps draws forecast samples inside ``torch.random.fork_rng()``
  reseeded to the same value, so every evaluation uses identical sample noise and the training
  RNG stream is left untouched.
"""
import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, IterableDataset
from transformers import (TimeSeriesTransformerConfig, TimeSeriesTransformerForPrediction,
                          get_cosine_schedule_with_warmup)

torch.set_num_threads(1)
set_seed(0)

N_SERIES, LENGTH = 16, 260
PREDICTION_LENGTH, CONTEXT_LENGTH = 14, 28
LAGS = [1, 2, 3, 7, 14]
PAST_LENGTH = CONTEXT_LENGTH + max(LAGS)


def make_series():
    rng = np.random.default_rng(0)
    t = np.arange(LENGTH)
    values, observed = [], []
    for i in range(N_SERIES):
        level, slope, amp = rng.uniform(5, 50), rng.uniform(-0.01, 0.05), rng.uniform(0.1, 0.4)
        y = level * (1 + slope * t / 10) * (1 + amp * np.sin(2 * np.pi * (t + i) / 7))
        y = np.maximum(y + rng.normal(0, 0.05 * level, LENGTH), 0.0)
        obs = rng.random(LENGTH) > 0.03           # ~3% missing
        values.append(np.where(obs, y, 0.0)), observed.append(obs)
    return np.array(values, np.float32), np.array(observed, np.float32)


def time_features(start, length):
    t = np.arange(start, start + length)
    day_of_week = (t % 7) / 6.0 - 0.5
    age = np.log1p(t) / np.log1p(LENGTH)
    return np.stack([day_of_week, age], axis=-1).astype(np.float32)


def window(values, observed, i, start):
    end = start + PAST_LENGTH
    return {"past_values": values[i, start:end], "past_observed_mask": observed[i, start:end],
            "past_time_features": time_features(start, PAST_LENGTH),
            "future_values": values[i, end:end + PREDICTION_LENGTH],
            "future_observed_mask": observed[i, end:end + PREDICTION_LENGTH],
            "future_time_features": time_features(end, PREDICTION_LENGTH),
            "static_categorical_features": np.array([i], np.int64)}


class RandomWindows(IterableDataset):
    """InstanceSplitter-style sampling of training windows (test region excluded)."""

    def __init__(self, values, observed, seed):
        self.values, self.observed, self.seed = values, observed, seed

    def __iter__(self):
        rng = np.random.default_rng(self.seed)
        last_start = LENGTH - PREDICTION_LENGTH - PAST_LENGTH - PREDICTION_LENGTH
        while True:
            i = int(rng.integers(N_SERIES))
            yield window(self.values, self.observed, i, int(rng.integers(0, last_start + 1)))


def to_batch(items):
    return {k: torch.from_numpy(np.stack([it[k] for it in items])) for k in items[0]}


@torch.no_grad()
def evaluate(model, test_batch, seed=1234):
    model.eval()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        out = model.generate(past_values=test_batch["past_values"], past_time_features=test_batch["past_time_features"],
                             past_observed_mask=test_batch["past_observed_mask"],
                             static_categorical_features=test_batch["static_categorical_features"],
                             future_time_features=test_batch["future_time_features"])
    model.train()
    forecast = out.sequences.median(dim=1).values
    target, mask = test_batch["future_values"], test_batch["future_observed_mask"]
    mae = ((forecast - target).abs() * mask).sum(1) / mask.sum(1)
    seasonal_naive = (test_batch["past_values"][:, 7:] - test_batch["past_values"][:, :-7]).abs().mean(1)
    return (mae / seasonal_naive).mean().item()


def main():
    accelerator = Accelerator(gradient_accumulation_steps=2)
    values, observed = make_series()
    config = TimeSeriesTransformerConfig(
        prediction_length=PREDICTION_LENGTH, context_length=CONTEXT_LENGTH, lags_sequence=LAGS,
        num_time_features=2, num_static_categorical_features=1, cardinality=[N_SERIES],
        embedding_dimension=[4], encoder_layers=2, decoder_layers=2, d_model=32,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, dropout=0.1, num_parallel_samples=50)
    model = TimeSeriesTransformerForPrediction(config)

    train_dataloader = DataLoader(RandomWindows(values, observed, seed=0), batch_size=32, collate_fn=to_batch)
    test_batch = to_batch([window(values, observed, i, LENGTH - PREDICTION_LENGTH - PAST_LENGTH) for i in range(N_SERIES)])

    num_update_steps = 40
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=1e-1)
    lr_scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=4, num_training_steps=num_update_steps)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)

    print(f"MASE before training: {evaluate(accelerator.unwrap_model(model), test_batch):.3f}")
    model.train()
    update_step, running = 0, []
    for idx, batch in enumerate(train_dataloader):
        with accelerator.accumulate(model):
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
        running.append(loss.item())
        if accelerator.sync_gradients:
            update_step += 1
            if update_step % 5 == 0:
                accelerator.print(f"update {update_step:2d}  nll {np.mean(running):+.4f}  lr {lr_scheduler.get_last_lr()[0]:.2e}")
                running = []
            if update_step % 15 == 0 or update_step == num_update_steps:
                mase = evaluate(accelerator.unwrap_model(model), test_batch)
                accelerator.print(f"[eval @ update {update_step}] MASE {mase:.3f}")
            if update_step == num_update_steps:
                break


if __name__ == "__main__":
    main()
