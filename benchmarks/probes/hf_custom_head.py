"""Healthy probe: a pretrained-encoder classifier with a custom head on the [CLS] state (the Kaggle/blog recipe): AutoModel keeps its pooler, which runs every forward and that the loss never uses; AdamW over all parameters with a linear warm-up."""
import torch
from torch import nn
from transformers import BertConfig, BertModel, get_linear_schedule_with_warmup

torch.manual_seed(0)
config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=32)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = BertModel(config)  # add_pooling_layer=True: the pooler runs, unused
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(32, 2)

    def forward(self, ids, mask):
        hidden = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        return self.head(self.dropout(hidden[:, 0]))


model = Classifier()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=12)
model.train()
for step in range(12):
    ids = torch.randint(1, 64, (8, 16))
    labels = (ids[:, 1] > 32).long()
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(ids, torch.ones_like(ids)), labels)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    if step % 4 == 3:
        model.eval()
        with torch.no_grad():
            model(ids, torch.ones_like(ids))
        model.train()
print("done")
