"""Modelled on huggingface/transformers examples/pytorch/language-modeling/run_mlm.py
(RobertaForMaskedLM + DataCollatorForLanguageModeling + Trainer) combined with ULMFiT-style
gradual unfreezing and discriminative learning rates (Howard & Ruder 2018; fastai's
`freeze_to`), implemented as a TrainerCallback.

Exercises: a Trainer that starts with the embeddings and all but the top encoder layer frozen
(so the tied MLM decoder weight is frozen too and the optimizer is built from the trainable
subset only); a callback that, at fixed global steps, flips requires_grad on the next lower
layer and calls optimizer.add_param_group with a smaller, depth-discounted LR, registering the
new group with the LambdaLR warmup/decay schedule as well. The tokenizer is a WordLevel
`tokenizers` model wrapped in PreTrainedTokenizerFast (no downloads); text is a synthetic
Markov-chain language.
"""
import shutil
import random
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (RobertaConfig, RobertaForMaskedLM, PreTrainedTokenizerFast,
                          DataCollatorForLanguageModeling, Trainer, TrainingArguments, TrainerCallback, set_seed)

torch.set_num_threads(1)
set_seed(0)
random.seed(0)

# ---- tokenizer + corpus --------------------------------------------------------------------
specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
words = [f"w{i}" for i in range(30)]
vocab = {t: i for i, t in enumerate(specials + words)}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                    pad_token="<pad>", mask_token="<mask>", cls_token="<s>", sep_token="</s>")

succ = {w: random.sample(words, 2) for w in words}  # each word is usually followed by succ[w][0]


def sentence():
    w = random.choice(words)
    out = [w]
    for _ in range(random.randint(8, 20)):
        w = succ[w][0] if random.random() < 0.85 else succ[w][1]
        out.append(w)
    return " ".join(out)


class LineByLineDataset(torch.utils.data.Dataset):
    def __init__(self, n):
        self.examples = [tokenizer(sentence(), return_special_tokens_mask=True) for _ in range(n)]

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]


train_ds, eval_ds = LineByLineDataset(640), LineByLineDataset(64)
data_collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm_probability=0.15)

# ---- model, frozen except the top layer ------------------------------------------------------
config = RobertaConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                       intermediate_size=128, max_position_embeddings=40, pad_token_id=1, bos_token_id=0,
                       eos_token_id=2, type_vocab_size=1)
model = RobertaForMaskedLM(config)
model.resize_token_embeddings(len(tokenizer))
layers = model.roberta.encoder.layer
unfreeze_order = [layers[1], layers[0], model.roberta.embeddings]  # top-down, after the top layer
for module in unfreeze_order:
    module.requires_grad_(False)


class GradualUnfreezingCallback(TrainerCallback):
    """Every `every` steps unfreeze the next lower block and give it its own param group with
    lr = base_lr / decay**depth (discriminative fine-tuning)."""

    def __init__(self, modules, every, decay=2.6):
        self.modules, self.every, self.decay = modules, every, decay
        self.n_unfrozen = 0

    def on_step_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        if self.n_unfrozen >= len(self.modules) or state.global_step % self.every != 0:
            return
        module = self.modules[self.n_unfrozen]
        self.n_unfrozen += 1
        module.requires_grad_(True)
        base_lr = args.learning_rate / (self.decay ** self.n_unfrozen)
        params = [p for p in module.parameters() if p.requires_grad]
        # skip params already owned by a group (e.g. the word embedding tied to the MLM decoder)
        owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
        params = [p for p in params if id(p) not in owned]
        optimizer.add_param_group({"params": params, "lr": base_lr * lr_scheduler.get_last_lr()[0] / args.learning_rate,
                                   "weight_decay": args.weight_decay})
        sched = getattr(lr_scheduler, "scheduler", lr_scheduler)  # unwrap accelerate's AcceleratedScheduler
        sched.base_lrs.append(base_lr)
        sched.lr_lambdas.append(sched.lr_lambdas[0])
        print(f"step {state.global_step}: unfroze {type(module).__name__} ({sum(p.numel() for p in params)} params, "
              f"base lr {base_lr:.2e}); trainable now "
              f"{sum(p.numel() for p in model.parameters() if p.requires_grad)}")


shutil.rmtree("out/hf_roberta_mlm_unfreeze", ignore_errors=True)
args = TrainingArguments(output_dir="out/hf_roberta_mlm_unfreeze", max_steps=40, per_device_train_batch_size=32,
                         per_device_eval_batch_size=64, learning_rate=5e-3, weight_decay=0.01, warmup_steps=5,
                         lr_scheduler_type="linear", eval_strategy="steps", eval_steps=10, logging_steps=10,
                         save_strategy="no", report_to=[], use_cpu=True, seed=0, dataloader_num_workers=0)
trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds, data_collator=data_collator,
                  callbacks=[GradualUnfreezingCallback(unfreeze_order, every=10)])
trainer.train()
print({k: round(v, 4) for k, v in trainer.evaluate().items() if k in ("eval_loss", "epoch")})
print("lr per group:", [f"{g['lr']:.2e}" for g in trainer.optimizer.param_groups])
