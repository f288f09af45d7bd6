"""Healthy probe: the Lightning docs' LightningDataModule and inference guides with a small Transformer-encoder sequence classifier trained under precision="bf16-mixed" on CPU: a DataModule with prepare_data/setup and train, val and predict dataloaders, an overridden configure_gradient_clipping hook (the docs' pattern of calling self.clip_gradients only past a warm-up, using the Trainer's gradient_clip_val), validation every epoch, and trainer.predict(datamodule=...) after fit returning class probabilities from predict_step.

Sequences are random token ids; the class is which of three marker tokens occurs most.
"""
import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

SEED, VOCAB, LENGTH, CLASSES = 0, 40, 12, 3
L.seed_everything(SEED, verbose=False)


class MarkerDataModule(L.LightningDataModule):
    def __init__(self, batch_size=16):
        super().__init__()
        self.batch_size = batch_size

    @staticmethod
    def _make(n, seed):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(CLASSES, VOCAB, (n, LENGTH), generator=g)
        labels = torch.randint(0, CLASSES, (n,), generator=g)
        for i, label in enumerate(labels.tolist()):
            ids[i, torch.randperm(LENGTH, generator=g)[:3]] = label
        return ids, labels

    def setup(self, stage):
        if stage in ("fit", "validate"):
            self.train_set = torch.utils.data.TensorDataset(*self._make(128, 1))
            self.val_set = torch.utils.data.TensorDataset(*self._make(48, 2))
        if stage == "predict":
            self.predict_set = torch.utils.data.TensorDataset(self._make(32, 3)[0])

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.val_set, batch_size=self.batch_size)

    def predict_dataloader(self):
        return torch.utils.data.DataLoader(self.predict_set, batch_size=self.batch_size)


class EncoderClassifier(L.LightningModule):
    def __init__(self, d_model=32, clip_after=3, lr=2e-3):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Parameter(torch.zeros(1, LENGTH, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, CLASSES)

    def forward(self, ids):
        h = self.encoder(self.embed(ids) + self.pos)
        return self.head(self.norm(h.mean(1)))

    def training_step(self, batch, batch_idx):
        ids, y = batch
        loss = F.cross_entropy(self(ids), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        ids, y = batch
        logits = self(ids)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def predict_step(self, batch, batch_idx):
        (ids,) = batch
        return self(ids).float().softmax(-1)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        if self.global_step >= self.hparams.clip_after:
            self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                                gradient_clip_algorithm=gradient_clip_algorithm)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)


dm = MarkerDataModule()
model = EncoderClassifier()
trainer = L.Trainer(max_epochs=1, limit_train_batches=8, precision="bf16-mixed", gradient_clip_val=0.5,
                    gradient_clip_algorithm="norm", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
trainer.fit(model, datamodule=dm)
print(trainer.validate(model, datamodule=dm, verbose=False))
probs = torch.cat(trainer.predict(model, datamodule=dm))
print("predicted classes", probs.argmax(1).tolist())
