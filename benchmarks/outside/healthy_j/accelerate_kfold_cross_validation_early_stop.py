"""K-fold cross-validation of a small BERT pair classifier with accelerate, fold ensembling.

Modelled on: huggingface/accelerate ``examples/by_feature/cross_validation.py`` (for each
fold: build the dataloaders, *re-create* the model, optimizer and linear-warm-up
scheduler, ``accelerator.prepare`` them, train, evaluate on the held-out fold, predict
the common test set, ``accelerator.free_memory()``; at the end average the fold logits)
combined with ``examples/by_feature/early_stopping.py`` (``accelerator.set_trigger()``
when the validation loss stops improving, ``accelerator.check_trigger()`` to break out
of the loop on every process).  MRPC and ``bert-base-cased`` are replaced by a synthetic
paraphrase-pair task and a ``BertConfig``-built model.

What is unusual about the loop:
  * The model, optimizer and scheduler are thrown away and rebuilt three times in one
    run; every fold calls ``set_seed`` first, so each fold starts from identical initial
    weights and the optimizer state starts empty again (step counters restart at 0).
  * Warm-up from lr 0 at the start of every fold.
  * Early stopping (patience of 3 evaluations) is armed in every fold through
    ``set_trigger``/``check_trigger``; the folds also differ in length (the stratified
    folds are not the same size), so step counts do not line up across folds.
  * The validation loss sits on a plateau for the first ~12 steps of each fold before
    the model picks up the signal.
  * Validation runs in the middle of the epoch (every 4 optimizer steps) and
    ``gather_for_metrics`` is used for the predictions.
"""
import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.optim import AdamW
from torch.utils.data import DataLoader, TensorDataset
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

torch.set_num_threads(1)

VOCAB, HALF = 120, 12
CLS, SEP, NEGATION, FIRST_WORD = 1, 2, (5, 6, 7, 8), 10


def make_pairs(n, seed):
    """Sentence 2 is a noisy copy of sentence 1; non-paraphrases (label 0) also carry four
    'negation' tokens, an annotation artefact of the kind found in real NLI/paraphrase data."""
    g = torch.Generator().manual_seed(seed)
    s1 = torch.randint(FIRST_WORD, VOCAB, (n, HALF), generator=g)
    labels = torch.randint(0, 2, (n,), generator=g)
    s2 = s1.clone()
    swap = torch.rand(n, HALF, generator=g) < 0.25
    s2[swap] = torch.randint(FIRST_WORD, VOCAB, (int(swap.sum()),), generator=g)
    negation = torch.tensor(NEGATION)
    for i in torch.nonzero(labels == 0).flatten().tolist():
        pos = torch.randperm(HALF, generator=g)[:4]
        s2[i, pos] = negation[torch.randint(0, len(NEGATION), (4,), generator=g)]
    cls, sep = torch.full((n, 1), CLS), torch.full((n, 1), SEP)
    input_ids = torch.cat([cls, s1, sep, s2, sep], dim=1)
    token_type_ids = torch.cat([torch.zeros(n, HALF + 2, dtype=torch.long),
                                torch.ones(n, HALF + 1, dtype=torch.long)], dim=1)
    return input_ids, token_type_ids, labels


def stratified_kfold(labels, n_splits, seed):
    rng = np.random.RandomState(seed)
    folds = [[] for _ in range(n_splits)]
    for c in np.unique(labels):
        idx = np.where(labels == c)[0]
        rng.shuffle(idx)
        for k, chunk in enumerate(np.array_split(idx, n_splits)):
            folds[k].extend(chunk.tolist())
    all_idx = np.arange(len(labels))
    for k in range(n_splits):
        valid = np.array(sorted(folds[k]))
        yield np.setdiff1d(all_idx, valid), valid


def to_batch(batch):
    input_ids, token_type_ids, labels = batch
    return {"input_ids": input_ids, "token_type_ids": token_type_ids,
            "attention_mask": torch.ones_like(input_ids), "labels": labels}


def evaluate(accelerator, model, loader):
    model.eval()
    losses, preds, refs = [], [], []
    for batch in loader:
        batch = to_batch(batch)
        with torch.no_grad():
            out = model(**batch)
        logits, labels = accelerator.gather_for_metrics((out.logits, batch["labels"]))
        losses.append(accelerator.gather_for_metrics(out.loss.repeat(len(batch["labels"]))))
        preds.append(logits)
        refs.append(labels)
    model.train()
    logits, refs = torch.cat(preds), torch.cat(refs)
    return torch.cat(losses).mean().item(), (logits.argmax(-1) == refs).float().mean().item(), logits


def main():
    config = {"lr": 4e-3, "num_epochs": 2, "seed": 42, "batch_size": 32, "n_splits": 3,
              "eval_every": 4, "patience": 3}
    accelerator = Accelerator(cpu=True)
    ids, tts, labels = make_pairs(576, seed=0)
    test_ids, test_tts, test_labels = make_pairs(256, seed=1)
    test_loader = DataLoader(TensorDataset(test_ids, test_tts, test_labels), batch_size=64)
    model_config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=128,
                              max_position_embeddings=32, type_vocab_size=2, num_labels=2)

    test_predictions = []
    for fold, (train_idx, valid_idx) in enumerate(stratified_kfold(labels.numpy(), config["n_splits"], seed=0)):
        set_seed(config["seed"])  # every fold starts from the same initial weights
        train_loader = DataLoader(TensorDataset(ids[train_idx], tts[train_idx], labels[train_idx]),
                                  batch_size=config["batch_size"], shuffle=True)
        valid_loader = DataLoader(TensorDataset(ids[valid_idx], tts[valid_idx], labels[valid_idx]),
                                  batch_size=64)
        model = BertForSequenceClassification(model_config)
        optimizer = AdamW(params=model.parameters(), lr=config["lr"], weight_decay=0.01)
        num_training_steps = len(train_loader) * config["num_epochs"]
        lr_scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=3,
                                                       num_training_steps=num_training_steps)
        model, optimizer, train_loader, valid_loader, fold_test_loader, lr_scheduler = accelerator.prepare(
            model, optimizer, train_loader, valid_loader, test_loader, lr_scheduler)

        best_loss, bad_evals, step, stop = float("inf"), 0, 0, False
        model.train()
        for epoch in range(config["num_epochs"]):
            for batch in train_loader:
                outputs = model(**to_batch(batch))
                accelerator.backward(outputs.loss)
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
                step += 1
                if step % config["eval_every"] == 0:
                    val_loss, val_acc, _ = evaluate(accelerator, model, valid_loader)
                    accelerator.print(f"fold {fold} epoch {epoch} step {step:2d} "
                                      f"lr {lr_scheduler.get_last_lr()[0]:.2e} train_loss {outputs.loss.item():.4f} "
                                      f"val_loss {val_loss:.4f} val_acc {val_acc:.3f}")
                    if val_loss < best_loss - 1e-3:
                        best_loss, bad_evals = val_loss, 0
                    else:
                        bad_evals += 1
                    if bad_evals >= config["patience"]:
                        accelerator.set_trigger()
                if accelerator.check_trigger():
                    accelerator.print(f"fold {fold}: early stop after {step} steps")
                    stop = True
                    break
            if stop:
                break

        _, test_acc, fold_logits = evaluate(accelerator, model, fold_test_loader)
        accelerator.print(f"fold {fold} finished after {step} steps, test acc {test_acc:.3f}")
        test_predictions.append(fold_logits.cpu())
        # release the references held by the accelerator before the next fold rebuilds everything
        accelerator.free_memory()
        del model, optimizer, lr_scheduler

    preds = torch.stack(test_predictions).mean(0).argmax(-1)
    accelerator.print(f"ensemble of {len(test_predictions)} folds: test acc "
                      f"{(preds == test_labels).float().mean().item():.3f}")


if __name__ == "__main__":
    main()
