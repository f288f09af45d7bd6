"""Neural style transfer by optimising the image itself with L-BFGS.

Modelled on: the PyTorch tutorial "Neural Transfer Using PyTorch" (Gatys et al.;
``run_style_transfer``, ``ContentLoss``/``StyleLoss`` modules inserted after chosen
convolutions, ``gram_matrix``, ``get_input_optimizer`` returning
``optim.LBFGS([input_img])``, a closure that clamps the image in place under
``no_grad``, clears the gradients, runs the model and back-propagates the weighted
losses).  The feature network is a small convolutional stack with random frozen
weights in evaluation mode instead of a pretrained VGG19 (nothing is downloaded); the
content and style images are synthetic.  The only thing optimised is the input image:
the network's parameters never get a gradient.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def gram_matrix(features):
    batch, channels, height, width = features.size()
    flat = features.view(batch * channels, height * width)
    return flat @ flat.t() / (batch * channels * height * width)


class ContentLoss(nn.Module):
    def __init__(self, target):
        super().__init__()
        self.target = target.detach()
        self.loss = torch.zeros(())

    def forward(self, x):
        self.loss = F.mse_loss(x, self.target)
        return x


class StyleLoss(nn.Module):
    def __init__(self, target_feature):
        super().__init__()
        self.target = gram_matrix(target_feature).detach()
        self.loss = torch.zeros(())

    def forward(self, x):
        self.loss = F.mse_loss(gram_matrix(x), self.target)
        return x


def feature_network():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
    ).eval().requires_grad_(False)


def style_model_and_losses(cnn, style_img, content_img, content_layers=(4,), style_layers=(1, 3, 6, 8)):
    model = nn.Sequential()
    content_losses, style_losses = [], []
    for index, layer in enumerate(cnn):
        model.add_module(f"layer_{index}", layer)
        if index in content_layers:
            content_loss = ContentLoss(model(content_img))
            model.add_module(f"content_loss_{index}", content_loss)
            content_losses.append(content_loss)
        if index in style_layers:
            style_loss = StyleLoss(model(style_img))
            model.add_module(f"style_loss_{index}", style_loss)
            style_losses.append(style_loss)
    return model, style_losses, content_losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="L-BFGS steps (each evaluates the closure up to 4 times)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--style-weight", type=float, default=1e5)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    size = 24
    grid = torch.linspace(0, 6.28, size)
    stripes = torch.sin(grid * 3).view(1, 1, 1, size).expand(1, 3, size, size)
    style_img = (0.5 + 0.4 * stripes * torch.tensor([1.0, -1.0, 0.5]).view(1, 3, 1, 1)).clamp(0, 1)
    content_img = torch.zeros(1, 3, size, size)
    content_img[:, :, 6:18, 6:18] = torch.tensor([0.9, 0.3, 0.2]).view(1, 3, 1, 1)

    model, style_losses, content_losses = style_model_and_losses(feature_network(), style_img, content_img)
    input_img = content_img.clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS([input_img], max_iter=4)

    for step in range(args.steps):
        def closure():
            with torch.no_grad():
                input_img.clamp_(0, 1)
            optimizer.zero_grad()
            model(input_img)
            style_score = args.style_weight * sum(loss.loss for loss in style_losses)
            content_score = sum(loss.loss for loss in content_losses)
            loss = style_score + content_score
            loss.backward()
            return style_score + content_score

        loss = optimizer.step(closure)
        print(f"step {step} loss {loss.item():.4f}")

    with torch.no_grad():
        input_img.clamp_(0, 1)
    print("image mean per channel", [round(v, 3) for v in input_img.mean(dim=(0, 2, 3)).tolist()])


if __name__ == "__main__":
    main()
