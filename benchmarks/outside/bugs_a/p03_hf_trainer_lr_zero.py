"""p03 - class 2: HF Trainer, learning rate hits 0 partway through training (scheduler sized for one epoch).
Modelled on: huggingface/transformers #26827 "learning rate is 0 after half of max_train_steps"
(scheduler num_training_steps too small) and deepset-ai/FARM #46 "Wrong number of total steps for
linear warmup schedule ... LR = 0 for the last few steps".  Bug: a custom linear warmup/decay scheduler
is built with num_training_steps = len(train_dataloader) (one epoch = 12 steps) while training runs for
3 epochs (36 steps): from step 12 the optimizer updates nothing.  Onset: optimizer step 12 (0-based).
`--healthy` sizes the schedule for all 36 steps."""
import sys, os, torch
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, get_linear_schedule_with_warmup
healthy = '--healthy' in sys.argv
torch.manual_seed(0)
cfg = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=4)
model = GPT2LMHeadModel(cfg)
g = torch.Generator().manual_seed(1)
class DS(torch.utils.data.Dataset):
    def __init__(s):
        s.x = torch.randint(0, 128, (96, 24), generator=g); s.x[:, 12:] = s.x[:, :12]
    def __len__(s): return len(s.x)
    def __getitem__(s, i): return {"input_ids": s.x[i], "labels": s.x[i]}
ds = DS()
bs, epochs = 8, 3
steps_per_epoch = len(ds) // bs
total = steps_per_epoch * epochs if healthy else steps_per_epoch   # BUG: forgot * num_train_epochs
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=total)
if not healthy: print("ONSET: lr == 0 from optimizer step 12 (0-based)")
args = TrainingArguments(output_dir="out_p03", per_device_train_batch_size=bs,
                         num_train_epochs=epochs, logging_steps=6, save_strategy="no", report_to=[],
                         use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0)
Trainer(model=model, args=args, train_dataset=ds, optimizers=(opt, sched)).train()
