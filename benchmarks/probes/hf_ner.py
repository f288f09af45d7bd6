"""Healthy probe: Hugging Face token classification (run_ner.py style): BertForTokenClassification, DataCollatorForTokenClassification padding labels with -100, periodic evaluation."""
import torch, tempfile
from transformers import BertConfig, BertForTokenClassification, Trainer, TrainingArguments, DataCollatorForTokenClassification, PreTrainedTokenizerFast
from tokenizers import Tokenizer, models, pre_tokenizers
torch.manual_seed(0)
vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{f"w{i}": i + 4 for i in range(60)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")); tok.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]")
cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, num_labels=5)
model = BertForTokenClassification(cfg)
class DS(torch.utils.data.Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i); n = int(torch.randint(4, 12, (1,), generator=g))
        ids = torch.randint(4, 64, (n,), generator=g).tolist()
        return {"input_ids": ids, "labels": [x % 5 for x in ids]}
args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, max_steps=10, learning_rate=3e-4,
    weight_decay=0.01, warmup_ratio=0.1, logging_steps=5, report_to=[], save_strategy="no", eval_strategy="steps", eval_steps=5, use_cpu=True)
Trainer(model=model, args=args, train_dataset=DS(), eval_dataset=DS(), data_collator=DataCollatorForTokenClassification(tokenizer)).train()
