"""Modelled on huggingface/accelerate examples/nlp_example.py together with
examples/by_feature/gradient_accumulation.py and examples/by_feature/checkpointing.py
(BERT fine-tuning on GLUE-MRPC with Accelerator).

Tiny BertForSequenceClassification built from a BertConfig (no from_pretrained, no
tokenizer) on a synthetic MRPC-like sentence-pair input (CLS A SEP B SEP with token_type_ids); the
label is 1 iff sentence B contains a marker token.  Exercises Accelerator(cpu=True, mixed_precision="bf16",
gradient_accumulation_steps=2), accelerator.prepare, the accelerator.accumulate() context,
accelerator.clip_grad_norm_ under sync_gradients, AdamW + get_linear_schedule_with_warmup,
evaluation with gather_for_metrics under model.eval()/no_grad, save_state at each epoch end,
and a resume: a fresh Accelerator/model/optimizer restored with load_state from the
epoch-0 checkpoint, then the remaining epoch is trained again."""
import os, shutil
import torch
from torch.utils.data import DataLoader
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

CLS, SEP, PAD, V = 1, 2, 0, 120

def make_pairs(n, g, marker=3):
    """label 1 iff sentence B contains the 'paraphrase marker' token somewhere"""
    rows = []
    for _ in range(n):
        a = torch.randint(4, V, (int(torch.randint(5, 10, (1,), generator=g)),), generator=g)
        b = torch.randint(4, V, (int(torch.randint(5, 10, (1,), generator=g)),), generator=g)
        label = int(torch.rand(1, generator=g) < 0.5)
        if label:
            b[torch.randint(0, len(b), (3,), generator=g)] = marker     # up to 3 occurrences
        ids = [CLS] + a.tolist() + [SEP] + b.tolist() + [SEP]
        tt = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        rows.append({"input_ids": ids, "token_type_ids": tt, "labels": label})
    return rows

def collate_fn(examples):
    m = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), m), PAD, dtype=torch.long)
    tt = torch.zeros_like(ids)
    for i, e in enumerate(examples):
        ids[i, :len(e["input_ids"])] = torch.tensor(e["input_ids"])
        tt[i, :len(e["token_type_ids"])] = torch.tensor(e["token_type_ids"])
    return {"input_ids": ids, "token_type_ids": tt, "attention_mask": (ids != PAD).long(),
            "labels": torch.tensor([e["labels"] for e in examples])}

def get_dataloaders(batch_size=16, eval_batch_size=32):
    g = torch.Generator().manual_seed(0)
    train, val = make_pairs(320, g), make_pairs(96, g)
    train_dataloader = DataLoader(train, shuffle=True, collate_fn=collate_fn, batch_size=batch_size, drop_last=True)
    eval_dataloader = DataLoader(val, shuffle=False, collate_fn=collate_fn, batch_size=eval_batch_size)
    return train_dataloader, eval_dataloader

def evaluate(accelerator, model, eval_dataloader):
    model.eval()
    correct, total = 0, 0
    for batch in eval_dataloader:
        with torch.no_grad():
            outputs = model(**batch)
        predictions = outputs.logits.argmax(dim=-1)
        predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
        correct += (predictions == references).sum().item(); total += references.numel()
    return correct / total

def training_function(config, resume_from=None, start_epoch=0):
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=2)
    set_seed(config["seed"])
    train_dataloader, eval_dataloader = get_dataloaders(config["batch_size"])
    bert_cfg = BertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, max_position_embeddings=32, type_vocab_size=2, num_labels=2)
    model = BertForSequenceClassification(bert_cfg)
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=config["lr"], weight_decay=0.01)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer, num_warmup_steps=3,
        num_training_steps=(len(train_dataloader) * config["num_epochs"]) // 2)
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)

    if resume_from is not None:
        accelerator.print(f"Resumed from checkpoint: {resume_from}")
        accelerator.load_state(resume_from)

    n_updates = 0
    for epoch in range(start_epoch, config["num_epochs"]):
        model.train()
        for step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                    n_updates += 1
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
        acc = evaluate(accelerator, model, eval_dataloader)
        accelerator.print(f"epoch {epoch}: last loss {loss.item():.4f} lr {lr_scheduler.get_last_lr()[0]:.2e} "
                          f"eval accuracy {acc:.4f}")
        accelerator.save_state(os.path.join(config["output_dir"], f"epoch_{epoch}"))
    accelerator.print(f"optimizer updates in this run: {n_updates}")
    accelerator.end_training()
    return acc

if __name__ == "__main__":
    config = {"lr": 2e-3, "num_epochs": 2, "seed": 42, "batch_size": 8, "output_dir": "out/accelerate_nlp"}
    shutil.rmtree(config["output_dir"], ignore_errors=True)
    full = training_function(config)                                   # 2 epochs x 20 updates
    resumed = training_function(config, resume_from=os.path.join(config["output_dir"], "epoch_0"),
                                start_epoch=1)                         # redo epoch 1 from checkpoint
    print(f"full run acc {full:.4f} | resumed-from-epoch-0 acc {resumed:.4f}")
