"""P03 (class b: scheduler drives lr to 0 early) -- HF Trainer.

Modelled on deepset-ai/FARM#46 "Wrong number of total steps for linear warmup schedule"
(`Training beyond specified 't_total'. Learning rate multiplier set to 0`) and
huggingface/transformers#20916 (HF linear/polynomial schedulers stepped with the wrong
unit give lr 0).  The user passes their own (optimizer, scheduler) to Trainer and
computes num_training_steps = len(train_dataloader) -- forgetting * num_epochs -- so the
linear schedule reaches 0 after the first of 3 epochs (step 12 of 36) and the remaining
two epochs update nothing.  Healthy twin: num_training_steps = len(dl) * epochs.
"""
import sys, warnings, torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments, TrainerCallback, get_linear_schedule_with_warmup
from transformers.utils import logging as hl
hl.set_verbosity_error(); warnings.filterwarnings("ignore")
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
cfg = BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=32, num_labels=2)
model = BertForSequenceClassification(cfg)
N, L = 12 * 16, 16
ids = torch.randint(5, 200, (N, L)); lab = (ids[:, 0] > 100).long()
class DS(torch.utils.data.Dataset):
    def __len__(s): return N
    def __getitem__(s, i): return {"input_ids": ids[i], "attention_mask": torch.ones(L, dtype=torch.long), "labels": lab[i]}
EPOCHS, BS = 3, 16
steps_per_epoch = N // BS
total = steps_per_epoch * EPOCHS if HEALTHY else steps_per_epoch   # BUG: forgot * epochs
opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=total)
class Probe(TrainerCallback):
    def on_step_begin(s, args, state, control, **kw):
        if not HEALTHY and state.global_step == 12: print("ONSET step 12 lr=", opt.param_groups[0]["lr"])
        if state.global_step in (11, 12, 35): print(f"step {state.global_step} lr={opt.param_groups[0]['lr']:.2e}")
args = TrainingArguments(output_dir="_hf_out", num_train_epochs=EPOCHS, per_device_train_batch_size=BS,
                         logging_steps=1000, save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=DS(), optimizers=(opt, sched), callbacks=[Probe()]).train()
