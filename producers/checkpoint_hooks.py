"""Reentrant activation checkpointing: a training forward that runs without gradients.

``torch.utils.checkpoint.checkpoint(..., use_reentrant=True)`` (what Hugging Face's
``gradient_checkpointing=True`` uses by default) runs each wrapped block under
``torch.no_grad`` and runs it again with gradients during the backward.  That first
pass is part of a training step, not an evaluation: calls made there are recorded with
``ctx.grad = True``, or every checkpointed block's dropout would look like an
evaluation pass with dropout left on.  A pass whose inputs need no gradient (an
evaluation through the same checkpointed blocks) keeps ``ctx.grad = False``; inside a
model forward begun with gradients, such a pass is training whose blocks no gradient
will reach (embeddings frozen under reentrant checkpointing, transformers#21381): its
layers count as run for training in `producers.graph_cuts`, so the step that finds
them without gradients says so.  Non-reentrant checkpointing keeps gradients
enabled and needs nothing here.

torch offers no hook for this, so ``CheckpointFunction.forward`` is wrapped (one place;
`tests/integration/test_checkpointing.py` checks the behaviour relied on: that it
exists and runs the block with gradients disabled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.utils.checkpoint

from .patching import PatchHandle, patch_attribute

if TYPE_CHECKING:
    from .tracer import Tracer


def install_checkpoint_hooks(tracer: "Tracer") -> list[PatchHandle]:
    function = getattr(torch.utils.checkpoint, "CheckpointFunction", None)
    if function is None or "forward" not in function.__dict__:
        return []

    def make_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            # autograd runs every Function's forward without gradients, so the outer
            # mode is read off the inputs, as torch's own warning does: a pass whose
            # inputs need no gradient (evaluation under no_grad) stays an evaluation
            if not any(isinstance(arg, torch.Tensor) and arg.requires_grad for arg in args):
                if not tracer.cut_checkpoint_entered():
                    return original(*args, **kwargs)
                try:
                    return original(*args, **kwargs)
                finally:
                    tracer.cut_checkpoint_left()
            tracer.checkpoint_entered()
            try:
                return original(*args, **kwargs)
            finally:
                tracer.checkpoint_left()

        return forward

    # autograd calls ``cls.forward(ctx, ...)`` on the class, where a plain function is
    # not bound: it behaves as the static method torch declared
    return [patch_attribute(function, "forward", make_wrapper)]
