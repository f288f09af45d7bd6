"""Activation checkpointing that recomputes a random block without replaying its RNG.

``torch.utils.checkpoint.checkpoint`` runs a block once in the forward, keeps only its
inputs, and runs it again in the backward to get the activations the gradient needs.
With ``preserve_rng_state=False`` (a documented speed-up, "if you don't need the
randomness to be the same") the second run draws new random numbers: a block with
dropout recomputes its activations with other masks, and the gradients belong to a
different network than the one whose loss was computed (allenai/OLMo-core PR 828).
Nothing fails, since non-reentrant checkpointing only checks shapes; the updates are
simply biased, and only once dropout is on (many recipes turn it on late or only in
some blocks).

So every checkpointed block run with gradients is watched: whether it drew from the
default generators (the CPU one, and the current accelerator's once it is initialised)
and whether it asked for the RNG state to be kept.  The optimizer step that consumes
these blocks' gradients carries the contract ``replays_checkpoint_rng``: no block that
drew random numbers since the previous step did so without preserving the RNG.  Steps
whose checkpointed blocks drew nothing are not judged.  Blocks that use their own
``torch.Generator`` are not seen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.utils.checkpoint

from .patching import PatchHandle, patch_attribute

if TYPE_CHECKING:
    from .tracer import Tracer


def _rng_states() -> list[torch.Tensor]:
    states = [torch.random.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.append(torch.cuda.get_rng_state())
    return states


class CheckpointRng:
    """Whether the checkpointed blocks that drew random numbers since the latest
    optimizer step all kept their RNG state (None: none drew any)."""

    def __init__(self) -> None:
        self._replayed: bool | None = None

    def block_ran(self, preserved: bool) -> None:
        """A checkpointed block that drew random numbers."""
        self._replayed = preserved and self._replayed is not False

    def replays_checkpoint_rng(self) -> bool | None:
        """For an optimizer step: the verdict on the blocks since the previous one, once."""
        verdict, self._replayed = self._replayed, None
        return verdict


def patch_checkpoint_rng(tracer: "Tracer") -> list[PatchHandle]:
    """Watch ``torch.utils.checkpoint.checkpoint`` (``checkpoint_sequential`` and the
    transformers models' ``gradient_checkpointing_enable`` call it); the one public
    argument read is ``preserve_rng_state``, whose default is True."""
    if not callable(getattr(torch.utils.checkpoint, "checkpoint", None)):
        return []
    facts = tracer.contracts.checkpoint_rng

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
            if not tracer.enabled or tracer.busy or not torch.is_grad_enabled():
                return original(function, *args, **kwargs)
            try:
                before = _rng_states()
            except Exception as exc:
                tracer.internal_error("checkpoint RNG state", exc)
                return original(function, *args, **kwargs)
            output = original(function, *args, **kwargs)
            try:
                after = _rng_states()
                if len(after) != len(before) or not all(torch.equal(a, b) for a, b in zip(before, after)):
                    facts.block_ran(bool(kwargs.get("preserve_rng_state", True)))
            except Exception as exc:
                tracer.internal_error("checkpoint RNG state", exc)
            return output

        return checkpoint

    return [patch_attribute(torch.utils.checkpoint, "checkpoint", make)]
