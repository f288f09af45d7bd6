"""What counts as a gradient synchronisation (`producers.replicas.GradientSync`)."""

from __future__ import annotations

import torch

from producers.replicas import GradientSync


def test_a_reduced_scalar_between_backward_and_step_is_no_synchronisation():
    """Pipeline stages reduce the squared norm of their gradients to clip by the global
    norm; that scalar does not make them replicas.  A gradient or a bucket does."""
    sync = GradientSync()
    sync.collective_called("torch.distributed.all_reduce", True, torch.zeros(()))
    sync.collective_called("torch.distributed.all_reduce", True, [torch.zeros(1)])
    sync.collective_called("torch.distributed.barrier", True, None)
    sync.collective_called("torch.distributed.all_reduce", False, torch.zeros(8))
    assert not sync.shown
    sync.collective_called("torch.distributed.all_reduce", True, torch.zeros(8))
    assert sync.shown
