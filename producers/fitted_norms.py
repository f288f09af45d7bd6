"""BatchNorm layers evaluated on learned weights with statistics nothing ever fitted.

A BatchNorm layer in evaluation mode normalises with its running mean and variance.
Those are buffers, not parameters: an EMA or "mean teacher" that averages
``model.parameters()`` only (CuriousAI/mean-teacher issue 9), a copy of the weights made
parameter by parameter, a ``torch.optim.swa_utils.AveragedModel`` evaluated without
``update_bn``, or a checkpoint saved from ``named_parameters()`` carries the learned scale
and shift over but leaves the statistics at their initial zero mean and unit variance.
The evaluated model then normalises every feature with the wrong statistics, and its
predictions (pseudo-labels, validation scores) are quietly poor.

So each forward of a BatchNorm layer in evaluation mode without gradients carries the
contract ``evaluates_fitted_norm``: its running statistics are not both still at their
initial values while its affine parameters hold learned (not initial) values.  A model
evaluated before it trained (Lightning's sanity check) has initial affine parameters too
and is not judged; layers without affine parameters or running statistics are not
judged, and neither are layers whose tensors live on an accelerator (reading them would
block the step).  A layer seen once with fitted statistics is not read again.
"""

from __future__ import annotations

import weakref

import torch
from torch.nn.modules.batchnorm import _BatchNorm


class FittedNorms:
    """The BatchNorm layers whose running statistics have been seen fitted."""

    def __init__(self) -> None:
        self._fitted: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()

    def evaluates_fitted_statistics(self, module: torch.nn.Module) -> bool | None:
        """For an evaluation-mode forward without gradients (None: not judged)."""
        if not isinstance(module, _BatchNorm) or not module.track_running_stats:
            return None
        if module in self._fitted:
            return True
        mean, variance, weight, bias = module.running_mean, module.running_var, module.weight, module.bias
        if mean is None or variance is None or weight is None or bias is None:
            return None
        if any(tensor.device.type != "cpu" for tensor in (mean, variance, weight, bias)):
            return None
        with torch.no_grad():
            if bool(mean.any()) or not bool((variance == 1).all()):
                self._fitted.add(module)
                return True
            learned = bool((weight != 1).any()) or bool(bias.any())
        return False if learned else None
