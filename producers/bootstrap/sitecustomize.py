"""Auto-loaded by every Python process that `trainwatch collect` starts.

`trainwatch collect` puts this directory first on ``PYTHONPATH``.  Python imports
``sitecustomize`` at start-up, so this file runs in the training script, in every
torchrun worker, in ``mp.spawn`` children and in spawned DataLoader workers.  It does
as little as possible: it chain-loads the user's own ``sitecustomize`` (if one exists
further down ``sys.path``) and arranges for the instrumentation to be installed right
after ``torch`` finishes importing.  Processes that never import torch pay nothing
beyond this file.
"""

import os
import sys


def _chain_user_sitecustomize() -> None:
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved_path = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        spec = importlib.util.find_spec("sitecustomize")
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules["sitecustomize"] = module
            spec.loader.exec_module(module)
    except Exception as exc:  # mirror site.py: report, do not abort start-up
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        sys.path[:] = saved_path
        if ours is not None:
            sys.modules["sitecustomize"] = ours


class _InstallAfterTorchImport:
    """A ``sys.meta_path`` finder that lets ``import torch`` run, then instruments."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        execute = loader.exec_module
        finder = self

        def exec_module(module):
            execute(module)
            try:
                sys.meta_path.remove(finder)
            except ValueError:
                pass
            _install()

        loader.exec_module = exec_module
        return spec


def _install() -> None:
    try:
        import producers.runtime
    except ImportError:
        # `producers` is not installed into this interpreter: use the copy next to us.
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        try:
            import producers.runtime
        except ImportError as exc:
            print(f"trainwatch: instrumentation unavailable: {exc}", file=sys.stderr)
            return
    producers.runtime.install_from_env()


_chain_user_sitecustomize()
if os.environ.get("TRAINWATCH_ENABLE") == "1":
    if "torch" in sys.modules:
        _install()
    else:
        sys.meta_path.insert(0, _InstallAfterTorchImport())
