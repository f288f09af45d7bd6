"""BatchNorm layers frozen with their backbone that still update their running statistics.

``backbone.requires_grad_(False)`` freezes a BatchNorm's weight and bias, not its running
mean and variance: a training-mode forward keeps moving them towards the statistics of
whatever data passes (PyTorch issue 86590), and the "frozen" features drift under the
head.  Freezing a backbone means putting its BatchNorm layers in ``eval()`` too, and
training loops lose that to a ``model.train()`` after each validation (Lightning issue
18930).  So each training-mode forward of a BatchNorm layer with gradients enabled
carries the contract ``frozen_norm_keeps_stats``: its affine parameters are not all
frozen.  Momentum and teacher encoders (MoCo, BYOL, DINO) run their BatchNorm layers in
training mode on purpose, but without gradients: those forwards are not judged, nor
are layers without affine parameters or running statistics, nor a momentum of 0, nor the
layers of a weight average (an EMA teacher DINO runs with gradients enabled: its
parameters are copies of trained ones that no optimizer holds).  Nor
are layers whose optimizers are switched off as a whole: a GAN freezes one network while
the other one's update runs through it (CycleGAN's ``set_requires_grad``, Lightning's
``toggle_optimizer``), and both networks' statistics follow training on purpose.  A
layer frozen inside a model whose optimizer still trains the rest (fine-tuning with
``model.parameters()`` handed to the optimizer before the freeze, gt-pyg issue 112) is
judged.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.nn.modules.batchnorm import _BatchNorm


def keeps_frozen_statistics(module: torch.nn.Module, toggled_off: Callable[[torch.Tensor], bool],
                            is_average: Callable[[torch.Tensor], bool]) -> bool | None:
    """For a training-mode forward with gradients: False when a BatchNorm layer whose
    affine parameters are all frozen, and not held only by optimizers switched off as a
    whole (``toggled_off``), will update its running statistics; None where the contract
    does not apply."""
    if not isinstance(module, _BatchNorm) or not module.track_running_stats or module.momentum == 0:
        return None
    params = [param for param in module._parameters.values() if param is not None]
    if not params:
        return None
    if any(param.requires_grad for param in params):
        return True
    if any(toggled_off(param) for param in params) or all(is_average(param) for param in params):
        return None
    return False
