"""P07 (class d: init function re-applied mid-run) -- accelerate, GPT-2 built from config.

Modelled on huggingface/transformers#46620 "from_pretrained silently returns random-init
weights for custom PreTrainedModel subclasses" (PR #46632: `_init_weights` re-run after
the weights were loaded overwrites them in place) and transformers#4701 ("Why we need the
init_weight function").  At step 12 the script enters stage 2 and calls
model.apply(model._init_weights) intending to initialise only the newly enabled pieces,
but it re-initialises every Linear/Embedding/LayerNorm of the trained model in place.
Healthy twin: stage 2 applies nothing.
"""
import sys, warnings, torch
from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hl
hl.set_verbosity_error(); warnings.filterwarnings("ignore")
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=48, n_layer=2, n_head=2)
model = GPT2LMHeadModel(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
acc = Accelerator(cpu=True)
data = torch.arange(64).repeat(36 * 8, 1)[:, :16] * 0
base = torch.randint(0, 64, (36 * 8, 1)); data = (base + torch.arange(16)) % 64     # counting sequences
dl = torch.utils.data.DataLoader(data, batch_size=8)
model, opt, dl = acc.prepare(model, opt, dl)
model.train()
for step, x in enumerate(dl):
    if step == 12 and not HEALTHY:
        print("ONSET step", step)
        w = acc.unwrap_model(model)
        w.apply(w._init_weights)                    # BUG: re-initialises the whole trained model
    out = model(input_ids=x, labels=x)
    acc.backward(out.loss); opt.step(); opt.zero_grad()
    if step in (11, 12, 35): print(f"step {step} loss={out.loss.item():.3f} wte.std={acc.unwrap_model(model).transformer.wte.weight.std():.4f}")
