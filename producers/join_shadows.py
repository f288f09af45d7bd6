"""Iterations a rank shadows under ``torch.distributed.algorithms.join.Join``.

With uneven inputs, a rank whose data runs out first leaves its loop and waits in
``Join.__exit__``, which runs the joinables' main hooks once for every iteration the
other ranks still train: DDP's hook shadows their gradient all-reduce, and
ZeroRedundancyOptimizer's hook takes the optimizer step that updates and broadcasts
its shard.  Windows are numbered by each rank's own iterations, so unless those shadow
iterations count, a rank that joined early numbers every later step lower than its
peers, and cross-rank rules compare different iterations from the next epoch on.

So each shadow iteration ends a window of its own, with no parameter states (a rank
that shadows DDP alone keeps its old weights until Join's post hook broadcasts the
final model), and what the hooks do in it is Join's protocol, not the rank's training:
it is not recorded (no backward precedes ZeRO's shadow step; the all-reduces that
count the ranks still training pair a joined rank's zeros with the others' ones, the
latter issued by ``Join.notify_join_context`` in DDP's forward, which is not recorded
either).  The gradients the rank holds afterwards are its own last ones, not those its
peers trained on since, so the first clear after shadowing takes no snapshot of them.  ``Join.__exit__`` keeps its hooks in the private ``_join_hooks`` list; the
patch puts a counting hook in front of them for the duration of the exit, so only this
one attribute is relied on (tested).
"""

from __future__ import annotations

from typing import Any, Callable

from invariants.events import OPTIMIZER_ZERO_GRAD

from .patching import PatchHandle, patch_attribute

try:
    from torch.distributed.algorithms.join import Join, JoinHook
except ImportError:  # a torch built without distributed support
    Join = JoinHook = None


class JoinShadows:
    """Mixin of `Tracer`: the windows of shadowed iterations, and the patches that see them."""

    #: the window after this rank's latest shadowed iteration (-1: it never shadowed)
    _after_shadows = -1

    def leftover_grads_unshared(self, api: str) -> bool:
        """A ``zero_grad`` in the window after shadowing finds the gradients of the rank's
        own last iteration, not those its peers kept training with: they are not
        snapshotted (every optimizer's first clear there; later steps share them again)."""
        return api == OPTIMIZER_ZERO_GRAD and self.recorder.step == self._after_shadows

    def shadow_iteration(self) -> None:
        """The main hooks run once more: end a window without parameter states."""
        if not self.enabled:
            return
        try:
            self._end_step(states=[])
            self._after_shadows = self.recorder.step
            # the weights the rank holds after Join are not those its last step left
            # (ZeRO's shadow steps, DDP's final broadcast): no evaluation is judged on them
            self.contracts.eval_weights.forget_steps()
        except Exception as exc:
            self.internal_error("Join shadow iteration", exc)

    def install_join_shadows(self) -> list[PatchHandle]:
        """Patch ``Join.__exit__`` (shadowed iterations) and ``Join.notify_join_context``."""
        if Join is None:
            return []
        tracer = self

        class ShadowIterations(JoinHook):
            """Runs first among the main hooks: once per shadowed iteration."""

            def main_hook(self) -> None:
                tracer.shadow_iteration()

        def exit_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
            def join_exit(join: Any, *args: Any) -> Any:
                hooks = getattr(join, "_join_hooks", None)
                if not isinstance(hooks, list):
                    return original(join, *args)
                join._join_hooks = [ShadowIterations(), *hooks]
                try:
                    with tracer._tls.own_work():
                        return original(join, *args)
                finally:
                    join._join_hooks = hooks

            return join_exit

        def notify_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
            def notify_join_context(joinable: Any) -> Any:
                with tracer._tls.own_work():
                    return original(joinable)

            return notify_join_context

        # the replacement is a plain function on the class: torch calls it through the
        # class (``Join.notify_join_context(self)``), where no instance is bound
        return [patch_attribute(Join, "__exit__", exit_wrapper),
                patch_attribute(Join, "notify_join_context", notify_wrapper)]
