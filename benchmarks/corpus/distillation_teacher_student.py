"""Knowledge distillation of a small CNN student from a frozen, larger CNN teacher.

Modelled on: the PyTorch tutorial "Knowledge Distillation Tutorial"
(pytorch/tutorials beginner_source/knowledge_distillation_tutorial.py) and Hinton et
al.'s soft-target recipe.  Habits reproduced: a ``train_knowledge_distillation(teacher,
student, train_loader, epochs, learning_rate, T, soft_target_loss_weight,
ce_loss_weight, device)`` function; ``teacher.eval()`` and ``student.train()`` set once
before the loop; teacher logits under ``torch.no_grad()`` every batch; soft targets with
``softmax(teacher / T)`` against ``log_softmax(student / T)``, the soft loss scaled by
``T**2`` and mixed with cross-entropy; Adam over the student's parameters only; a
``test(model, loader)`` accuracy function; the teacher's weights loaded from a checkpoint
file (here written from a seeded initialisation, as a stand-in for a trained teacher).
"""

import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset


class DeepNN(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, kernel_size=3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 16, kernel_size=3, padding=1), nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
            nn.Conv2d(16, 16, kernel_size=3, padding=1), nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(16 * 4 * 4, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, num_classes),
        )

    def forward(self, x):
        x = self.features(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


class LightNN(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=3, padding=1), nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
            nn.Conv2d(8, 8, kernel_size=3, padding=1), nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(8 * 4 * 4, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, num_classes),
        )

    def forward(self, x):
        x = self.features(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


def make_loader(n, seed, shuffle, batch_size=16):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 5, (n,), generator=g)
    images = torch.randn(n, 3, 16, 16, generator=g)
    images[torch.arange(n), labels % 3, :, :] += (labels.float() / 4).view(-1, 1, 1)
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size, shuffle=shuffle,
                      generator=torch.Generator().manual_seed(seed) if shuffle else None)


def train_knowledge_distillation(teacher, student, train_loader, max_steps, learning_rate, T,
                                 soft_target_loss_weight, ce_loss_weight, device):
    ce_loss = nn.CrossEntropyLoss()
    optimizer = optim.Adam(student.parameters(), lr=learning_rate)

    teacher.eval()  # Teacher set to evaluation mode
    student.train()  # Student to train mode

    step = 0
    epoch = 0
    while step < max_steps:
        running_loss = 0.0
        batches = 0
        for inputs, labels in train_loader:
            inputs, labels = inputs.to(device), labels.to(device)

            optimizer.zero_grad()

            # Forward pass with the teacher model - do not save gradients here as we do not change the teacher's weights
            with torch.no_grad():
                teacher_logits = teacher(inputs)

            student_logits = student(inputs)

            soft_targets = F.softmax(teacher_logits / T, dim=-1)
            soft_prob = F.log_softmax(student_logits / T, dim=-1)
            # KL(teacher || student), scaled by T**2 as in "Distilling the Knowledge in a Neural Network"
            soft_targets_loss = F.kl_div(soft_prob, soft_targets, reduction="batchmean") * (T ** 2)

            label_loss = ce_loss(student_logits, labels)
            loss = soft_target_loss_weight * soft_targets_loss + ce_loss_weight * label_loss

            loss.backward()
            optimizer.step()

            running_loss += loss.item()
            batches += 1
            step += 1
            if step >= max_steps:
                break
        print(f"Epoch {epoch + 1}, Loss: {running_loss / batches}")
        epoch += 1


def test(model, test_loader, device):
    model.to(device)
    model.eval()
    correct = 0
    total = 0
    with torch.no_grad():
        for inputs, labels in test_loader:
            inputs, labels = inputs.to(device), labels.to(device)
            outputs = model(inputs)
            _, predicted = torch.max(outputs.data, 1)
            total += labels.size(0)
            correct += (predicted == labels).sum().item()
    accuracy = 100 * correct / total
    print(f"Test Accuracy: {accuracy:.2f}%")
    return accuracy


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)

    train_loader = make_loader(96, args.seed, shuffle=True)
    test_loader = make_loader(32, args.seed + 1, shuffle=False)

    with tempfile.TemporaryDirectory() as tmp:
        teacher_path = os.path.join(tmp, "teacher.pth")
        torch.save(DeepNN(num_classes=5).state_dict(), teacher_path)
        nn_deep = DeepNN(num_classes=5).to(device)
        nn_deep.load_state_dict(torch.load(teacher_path, weights_only=True))
    for p in nn_deep.parameters():
        p.requires_grad = False

    torch.manual_seed(args.seed)
    new_nn_light = LightNN(num_classes=5).to(device)
    total_params_deep = sum(p.numel() for p in nn_deep.parameters())
    total_params_light = sum(p.numel() for p in new_nn_light.parameters())
    print(f"DeepNN parameters: {total_params_deep:,}  LightNN parameters: {total_params_light:,}")

    test_accuracy_deep = test(nn_deep, test_loader, device)
    train_knowledge_distillation(teacher=nn_deep, student=new_nn_light, train_loader=train_loader,
                                 max_steps=args.steps, learning_rate=args.lr, T=args.temperature,
                                 soft_target_loss_weight=0.25, ce_loss_weight=0.75, device=device)
    test_accuracy_light_ce_and_kd = test(new_nn_light, test_loader, device)
    print(f"Teacher accuracy: {test_accuracy_deep:.2f}%")
    print(f"Student accuracy with CE + KD: {test_accuracy_light_ce_and_kd:.2f}%")


if __name__ == "__main__":
    main()
