"""Modelled on huggingface/accelerate examples/nlp_example.py (BERT sequence classification:
Accelerator(mixed_precision=...), accelerator.prepare(model, optimizer, dataloaders, scheduler),
get_linear_schedule_with_warmup, eval each epoch with model.eval() + torch.no_grad() and
accelerator.gather_for_metrics) combined with examples/by_feature/gradient_accumulation.py
(Accelerator(gradient_accumulation_steps=2) + `with accelerator.accumulate(model):`).
BERT from a tiny BertConfig; synthetic paired-sentence 'paraphrase' task."""
import torch
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup
set_seed(42)
V, L = 100, 16
def make(n, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(5, V, (n, L // 2), generator=g); y = torch.randint(0, 2, (n,), generator=g)
    b = torch.where(y[:, None].bool(), a.roll(1, 1), torch.randint(5, V, (n, L // 2), generator=g))
    ids = torch.cat([torch.full((n, 1), 2), a, torch.full((n, 1), 3), b[:, :-2]], 1)
    tt = torch.cat([torch.zeros(n, L // 2 + 2, dtype=torch.long), torch.ones(n, L // 2 - 2, dtype=torch.long)], 1)
    return TensorDataset(ids, tt, torch.ones_like(ids), y)
def main():
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=2)
    lr, num_epochs, bs = 1e-3, 3, 16
    train_dl = DataLoader(make(320, 0), shuffle=True, batch_size=bs, drop_last=True)
    eval_dl = DataLoader(make(64, 1), shuffle=False, batch_size=32)
    model = BertForSequenceClassification(BertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, max_position_embeddings=32, num_labels=2))
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = get_linear_schedule_with_warmup(optimizer=optimizer, num_warmup_steps=3,
        num_training_steps=(len(train_dl) * num_epochs) // 2)
    model, optimizer, train_dl, eval_dl, lr_scheduler = accelerator.prepare(model, optimizer, train_dl, eval_dl, lr_scheduler)
    for epoch in range(num_epochs):
        model.train()
        for step, (ids, tt, am, y) in enumerate(train_dl):
            with accelerator.accumulate(model):
                out = model(input_ids=ids, token_type_ids=tt, attention_mask=am, labels=y)
                accelerator.backward(out.loss)
                optimizer.step(); lr_scheduler.step(); optimizer.zero_grad()
        model.eval(); correct = total = 0
        for ids, tt, am, y in eval_dl:
            with torch.no_grad():
                logits = model(input_ids=ids, token_type_ids=tt, attention_mask=am).logits
            preds, refs = accelerator.gather_for_metrics((logits.argmax(dim=-1), y))
            correct += (preds == refs).sum().item(); total += refs.numel()
        accelerator.print(f"epoch {epoch}: acc {correct/total:.3f}")
if __name__ == "__main__":
    main()
