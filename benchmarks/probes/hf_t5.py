"""Healthy probe: Hugging Face Seq2SeqTrainer fine-tuning a T5 (examples/pytorch/translation/run_translation.py style), built from a config on synthetic pairs."""
import tempfile
import torch
from transformers import T5Config, T5ForConditionalGeneration, Seq2SeqTrainer, Seq2SeqTrainingArguments
torch.manual_seed(0)
cfg = T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0)
model = T5ForConditionalGeneration(cfg)
class DS(torch.utils.data.Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randint(1, 100, (12,), generator=g)
        return {"input_ids": x, "attention_mask": torch.ones(12, dtype=torch.long), "labels": x.flip(0)[:8]}
args = Seq2SeqTrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, max_steps=12,
    learning_rate=1e-3, warmup_steps=2, logging_steps=4, report_to=[], save_strategy="no", eval_strategy="steps", eval_steps=6,
    per_device_eval_batch_size=8, predict_with_generate=False, use_cpu=True, dataloader_num_workers=0, )
Seq2SeqTrainer(model=model, args=args, train_dataset=DS(), eval_dataset=DS()).train()
