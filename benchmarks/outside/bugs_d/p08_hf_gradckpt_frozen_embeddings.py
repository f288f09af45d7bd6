"""P08 (class: loss/grad path broken so part of the model gets no gradient -- reentrant
gradient checkpointing after the input embeddings are frozen) -- HF Trainer.

Modelled on huggingface/transformers#21381 "gradient checkpointing disables requires_grad
when freezing part of models (fix with use_reentrant=False)": with the (default) reentrant
`torch.utils.checkpoint`, if the hidden states entering a checkpointed block do not require
grad (because the embedding layer is frozen), the block's output does not require grad
either, so *none* of the checkpointed decoder layers receive gradients; torch only emits
the UserWarning "None of the inputs have requires_grad=True. Gradients will be None".
Same report: huggingface/transformers#23170 "Gradient Checkpointing Fails with frozen
parameters"; the warning also appears in hiyouga/LlamaFactory#4905 with freeze-tuning.

A tiny Llama causal LM (config-built, untied embeddings) is trained with the HF Trainer,
`gradient_checkpointing=True`, bf16 autocast on CPU.  A callback freezes the input
embeddings after a 12-step warm-up ("freeze embeddings, keep tuning the body").  From
step 12 on, only the final norm and lm_head still get gradients; every decoder layer is
silently frozen too.  Healthy twin: `gradient_checkpointing_kwargs={"use_reentrant": False}`
(the fix proposed in the issue); everything else identical.
"""
import sys, warnings
import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, TrainerCallback
from transformers.utils import logging as hf_logging

HEALTHY = "--healthy" in sys.argv
hf_logging.set_verbosity_error()
warnings.filterwarnings("once", message="None of the inputs have requires_grad")
torch.set_num_threads(1)   # keep CPU runs predictable on small machines
torch.manual_seed(0)

VOCAB, SEQ = 128, 48
FREEZE_EMB_AT = 12


class MarkovLMDataset(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(1000)          # same "language" for train/eval
        trans = torch.softmax(torch.randn(VOCAB, VOCAB, generator=g) * 2.5, -1)
        g = torch.Generator().manual_seed(seed)
        x = torch.empty(n, SEQ, dtype=torch.long)
        x[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
        for t in range(1, SEQ):
            x[:, t] = torch.multinomial(trans[x[:, t - 1]], 1, generator=g).squeeze(1)
        self.x = x

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": self.x[i]}


class FreezeEmbeddingsCallback(TrainerCallback):
    def __init__(self, at_step):
        self.at_step, self.done = at_step, False

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if not self.done and state.global_step >= self.at_step:
            model.get_input_embeddings().requires_grad_(False)
            self.done = True
            print(f"[callback] step {state.global_step}: froze input embeddings")
            if not HEALTHY:
                print("ONSET step", state.global_step)


def main():
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                      tie_word_embeddings=False, use_cache=False)
    model = LlamaForCausalLM(cfg)
    train_ds, eval_ds = MarkovLMDataset(768, 1), MarkovLMDataset(128, 2)
    args = TrainingArguments(
        output_dir="bugsd_p08_out", max_steps=36, per_device_train_batch_size=16, gradient_accumulation_steps=1,
        learning_rate=3e-3, weight_decay=0.0, warmup_steps=3, lr_scheduler_type="cosine",
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False} if HEALTHY else None,
        bf16=True, use_cpu=True, eval_strategy="steps", eval_steps=12, per_device_eval_batch_size=64,
        logging_steps=4, save_strategy="no", report_to=[], seed=0, disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                      callbacks=[FreezeEmbeddingsCallback(FREEZE_EMB_AT)])
    trainer.train()
    print("final eval loss:", round(trainer.evaluate()["eval_loss"], 4))


if __name__ == "__main__":
    main()
