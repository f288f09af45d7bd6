"""Adversarial training of a TextCNN (with BatchNorm) for sentiment classification,
structured like TextAttack's ``Trainer``. The first ``num_clean_epochs`` are clean. At
the start of every later epoch, a greedy word-swap attack (word-importance ranking,
then synonym substitution) is run against the current model. The perturbed examples
are added to that epoch's training set.

Modelled on: QData/TextAttack#457 "Question related to adversarial training": "are you
guys making the model to eval() mode when attacking during adversarial training?" The
maintainer (jxmorris12): "Looks like the model is still in training mode when the
adversarial examples are generated ... This decision is, at least, questionable". The
reporter: "I believe it should be in eval mode when doing attacks" (cf.
bethgelab/foolbox#74). In train mode, every attack query is a forward pass with
dropout on and BatchNorm in batch-stat mode. So (1) the attack searches against a
randomly thinned network, and (2) the hundreds of query batches (perturbed candidates,
not training data) overwrite the BN running statistics.

What is unusual about the loop: many no-grad forward passes run between optimizer
steps, and the training set changes from epoch to epoch. ``--healthy`` wraps the
attack in ``model.eval()`` ... ``model.train()``.
"""
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv
POS = list(range(2, 10)); NEG = list(range(10, 18)); WEAK_POS = list(range(18, 26)); WEAK_NEG = list(range(26, 34))
NEUTRAL = list(range(34, 80))
SYNONYMS = {w: [WEAK_POS[i], WEAK_POS[(i + 3) % 8]] for i, w in enumerate(POS)}
SYNONYMS.update({w: [WEAK_NEG[i], WEAK_NEG[(i + 5) % 8]] for i, w in enumerate(NEG)})


@dataclass
class TrainingArgs:
    num_epochs: int = 4
    num_clean_epochs: int = 1
    num_train_adv_examples: int = 64
    per_device_train_batch_size: int = 32
    learning_rate: float = 3e-3
    max_swaps: int = 3


def make_dataset(n, g, L=16):
    xs, ys = [], []
    for _ in range(n):
        y = int(torch.randint(2, (1,), generator=g))
        strong, weak = (POS, WEAK_POS) if y else (NEG, WEAK_NEG)
        toks = [NEUTRAL[int(i)] for i in torch.randint(len(NEUTRAL), (L,), generator=g)]
        for pos in torch.randperm(L, generator=g)[:3].tolist():
            pool = strong if torch.rand(1, generator=g) < 0.7 else weak
            toks[pos] = pool[int(torch.randint(8, (1,), generator=g))]
        xs.append(toks); ys.append(y)
    return torch.tensor(xs), torch.tensor(ys)


class TextCNN(nn.Module):
    def __init__(self, vocab=80, dim=32, ch=48, n_cls=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.conv = nn.Conv1d(dim, ch, 3, padding=1)
        self.bn = nn.BatchNorm1d(ch)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(ch, n_cls)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(self.emb(x).transpose(1, 2))))
        return self.fc(self.drop(h.max(dim=2).values))


@torch.no_grad()
def greedy_word_swap_attack(model, x, y, max_swaps):
    """Word-importance ranking (delete-one), then greedy synonym swaps that maximise the loss."""
    x = x.clone()
    base = F.cross_entropy(model(x), y, reduction="none")
    importance = torch.zeros(x.shape, dtype=torch.float)
    for pos in range(x.size(1)):
        x_del = x.clone(); x_del[:, pos] = 1  # [UNK]
        importance[:, pos] = F.cross_entropy(model(x_del), y, reduction="none") - base
    order = importance.argsort(dim=1, descending=True)
    for r in range(max_swaps):
        pos = order[:, r]
        best, best_loss = x.clone(), F.cross_entropy(model(x), y, reduction="none")
        for c in range(2):
            cand = x.clone()
            for i in range(x.size(0)):
                w = int(x[i, pos[i]])
                if w in SYNONYMS:
                    cand[i, pos[i]] = SYNONYMS[w][c]
            loss = F.cross_entropy(model(cand), y, reduction="none")
            better = loss > best_loss
            best[better], best_loss[better] = cand[better], loss[better]
        x = best
    return x


class Trainer:
    def __init__(self, model, args, train, test):
        self.model, self.args, self.train_x, self.train_y, self.test = model, args, *train, test
        self.optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate)
        self.g = torch.Generator().manual_seed(7)
        self.train_forwards = 0
        self.attack_success = []

    def _generate_adversarial_examples(self, epoch):
        idx = torch.randperm(len(self.train_y), generator=self.g)[: self.args.num_train_adv_examples]
        if HEALTHY:
            self.model.eval()
        x_adv = greedy_word_swap_attack(self.model, self.train_x[idx], self.train_y[idx], self.args.max_swaps)
        if HEALTHY:
            self.model.train()
        self.model.eval()
        with torch.no_grad():
            success = (self.model(x_adv).argmax(1) != self.train_y[idx]).float().mean().item()
        self.model.train()
        return x_adv, self.train_y[idx], success

    def evaluate(self):
        self.model.eval()
        with torch.no_grad():
            acc = (self.model(self.test[0]).argmax(1) == self.test[1]).float().mean().item()
        self.model.train()
        return acc

    def train(self):
        step, bs = 0, self.args.per_device_train_batch_size
        self.model.train()
        for epoch in range(self.args.num_epochs):
            x, y = self.train_x, self.train_y
            if epoch >= self.args.num_clean_epochs:
                x_adv, y_adv, success = self._generate_adversarial_examples(epoch)
                x, y = torch.cat([x, x_adv]), torch.cat([y, y_adv])
                self.attack_success.append(success)
                print(f"epoch {epoch}: attack success (eval-mode check) {success:.2f}")
            perm = torch.randperm(len(y), generator=self.g)
            for b in range(0, len(y) - bs + 1, bs):
                if not HEALTHY and epoch == self.args.num_clean_epochs and b == 0:
                    print(f"ONSET step {step}")
                bi = perm[b:b + bs]
                loss = F.cross_entropy(self.model(x[bi]), y[bi])
                self.train_forwards += 1
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                step += 1
            print(f"epoch {epoch}: last loss {loss.item():.4f} test acc {self.evaluate():.3f} steps {step}")
        return step


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    train = make_dataset(192, g)
    test = make_dataset(256, g)
    model = TextCNN()
    trainer = Trainer(model, TrainingArgs(), train, test)
    trainer.train()
    with torch.no_grad():
        true_mean = model.conv(model.emb(test[0]).transpose(1, 2)).mean(dim=(0, 2))
    stat_err = (model.bn.running_mean - true_mean).abs().mean().item()
    print(f"EVIDENCE bn_num_batches_tracked={int(model.bn.num_batches_tracked)} train_forwards={trainer.train_forwards} "
          f"bn_running_mean_err={stat_err:.4f} "
          f"mean_attack_success={sum(trainer.attack_success) / len(trainer.attack_success):.3f} test_acc={trainer.evaluate():.3f}")


if __name__ == "__main__":
    main()
