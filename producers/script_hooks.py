"""TorchScript compiles the Python functions a scripted module calls from their source.

It resolves each name through the function object it finds: a wrapper of ours there
(``torch.nn.functional.dropout`` is wrapped to record its calls) made
``torch.jit.script`` fail on every module that uses dropout, crashing the program.
While a script compiles, the function wrappers on modules are taken off, so scripts
bind torch's own functions.  Scripted code runs outside Python and, like compiled
regions, is not recorded.

``torch.jit.script`` also resolves the free names of a scripted *class* in its caller's
frame, found by counting frames up from itself (``_frames_up``): the patch's switch
and this wrapper are two frames more, so it passes ``_frames_up + 2``, or scripting a class that calls a
module-level function (as importing ``torch.distributed.optim`` does) fails with
"undefined value".  tests/integration/test_scripted_modules.py pins that behaviour.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch.jit

from .patching import PatchHandle, patch_attribute


#: frames between the caller of ``torch.jit.script`` and torch's own: the patch's
#: switch (`patching.patch_attribute`) and the wrapper below
_OUR_FRAMES = 2


def patch_jit_script(handles: list[Any]) -> PatchHandle:
    """Wrap ``torch.jit.script`` so that it compiles with ``handles``' function wrappers off."""

    def make_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
        def script(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if len(args) > 1:  # optimize, _frames_up, _rcb, ... given by position
                args = (args[0], args[1] + _OUR_FRAMES, *args[2:])
            else:
                kwargs["_frames_up"] = kwargs.get("_frames_up", 0) + _OUR_FRAMES
            with _unwrapped(handles):
                return original(obj, *args, **kwargs)

        return script

    return patch_attribute(torch.jit, "script", make_wrapper)


@contextmanager
def _unwrapped(handles: list[Any]) -> Iterator[None]:
    # only wrappers that are installed (a nested compile finds them already off)
    swapped = [handle for handle in handles
               if isinstance(handle, PatchHandle) and isinstance(handle.owner, types.ModuleType)
               and handle.owner.__dict__.get(handle.attr) is handle.replacement]
    for handle in swapped:
        setattr(handle.owner, handle.attr, handle.original)
    try:
        yield
    finally:
        for handle in swapped:
            if handle.owner.__dict__.get(handle.attr) is handle.original:
                setattr(handle.owner, handle.attr, handle.replacement)
