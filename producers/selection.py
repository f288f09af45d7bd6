"""Which APIs a producer records: the curated default set, a list file, or invariants.

Selective instrumentation is what keeps the overhead low: everything not selected
returns through a single set lookup.  ``-i FILE`` accepts

* a plain text file of API family names, one per line, ``#`` starts a comment;
* an invariants JSON file: if the invariants core provides
  ``invariants.selection.needed_apis(invariant_set)`` it decides; otherwise every
  string found in an ``"apis"`` list anywhere in the JSON is taken.

Names are the stable *family* names events carry in their ``api`` field (e.g.
``torch.optim.Optimizer.step``), so a selection learnt on one model transfers to
another.  Parameter snapshots are taken when the optimizer step or zero_grad
families are selected.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

OPTIMIZER_STEP = "torch.optim.Optimizer.step"
OPTIMIZER_ZERO_GRAD = "torch.optim.Optimizer.zero_grad"
MODULE_FORWARD = "torch.nn.Module.forward"
MODULE_TRAIN = "torch.nn.Module.train"
MODULE_EVAL = "torch.nn.Module.eval"
MODULE_ZERO_GRAD = "torch.nn.Module.zero_grad"
WORKER_INIT = "torch.utils.data.worker_init"
#: in-place writes on a parameter outside an optimizer step (see `producers.identity_hooks`)
PARAM_OVERWRITE = "torch.Tensor.param_overwrite"

DROPOUT_FUNCTIONS = (
    "torch.nn.functional.dropout",
    "torch.nn.functional.dropout1d",
    "torch.nn.functional.dropout2d",
    "torch.nn.functional.dropout3d",
    "torch.nn.functional.alpha_dropout",
    "torch.nn.functional.feature_alpha_dropout",
)
INIT_FUNCTIONS = tuple(
    f"torch.nn.init.{name}"
    for name in (
        "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
        "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
        "orthogonal_", "sparse_",
    )
)
COLLECTIVES = tuple(
    f"torch.distributed.{name}"
    for name in (
        "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
        "reduce_scatter_tensor", "reduce", "barrier", "all_to_all", "init_process_group",
    )
)

DEFAULT_APIS: frozenset[str] = frozenset(
    {
        OPTIMIZER_STEP,
        OPTIMIZER_ZERO_GRAD,
        MODULE_ZERO_GRAD,
        MODULE_TRAIN,
        MODULE_EVAL,
        MODULE_FORWARD,
        "torch.Tensor.backward",
        "torch.autograd.backward",
        "torch.nn.utils.clip_grad_norm_",
        "torch.autocast.__enter__",
        "torch.save",
        "torch.optim.lr_scheduler.LRScheduler.step",
        "torch.manual_seed",
        WORKER_INIT,
        PARAM_OVERWRITE,
        *DROPOUT_FUNCTIONS,
        *INIT_FUNCTIONS,
        *COLLECTIVES,
    }
)


class SelectionError(ValueError):
    """An ``-i`` file that cannot be read as an API list or an invariants file."""


@dataclass(frozen=True)
class Selection:
    """The APIs to record; ``full`` records every torch function as well."""

    apis: frozenset[str] = DEFAULT_APIS
    full: bool = False
    source: str = "default"
    #: snapshot points (``pre:<api>``, ``post:<api>``, ``step_end``) to take; None = all
    state_points: frozenset[str] | None = None

    def wants(self, api: str) -> bool:
        return self.full or api in self.apis

    def wants_point(self, point: str) -> bool:
        return self.full or self.state_points is None or point in self.state_points

    @property
    def snapshots(self) -> bool:
        """Parameter snapshots are needed by anything that looks at optimizer calls."""
        return self.full or OPTIMIZER_STEP in self.apis or OPTIMIZER_ZERO_GRAD in self.apis


def default_selection(full: bool = False) -> Selection:
    return Selection(apis=DEFAULT_APIS, full=full, source="full" if full else "default")


def load_selection(path: str | Path, full: bool = False) -> Selection:
    """Read ``-i FILE``; raises `SelectionError` with a one-line reason."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SelectionError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SelectionError(f"{path} is not a UTF-8 text file") from None
    stripped = text.lstrip()
    points: frozenset[str] | None = None
    if stripped.startswith(("{", "[")):
        apis, points = _apis_from_invariants(text, path)
    else:
        apis = _apis_from_list(text)
    if not apis:
        raise SelectionError(f"{path} names no API to instrument")
    # Step boundaries come from optimizer hooks, so those are always on.
    return Selection(apis=frozenset(apis) | {OPTIMIZER_STEP}, full=full, source=str(path), state_points=points)


def _apis_from_list(text: str) -> set[str]:
    apis = set()
    for line in text.splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            apis.add(name)
    return apis


def _apis_from_invariants(text: str, path: Path) -> tuple[set[str], frozenset[str] | None]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SelectionError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    needed = _core_needed(document, path)
    if needed is not None:
        return needed
    return set(_strings_under_apis(document)), None


def _core_needed(document: Any, path: Path) -> tuple[set[str], frozenset[str] | None] | None:
    """Ask the invariants core which APIs and snapshot points an invariant set needs."""
    try:
        core = importlib.import_module("invariants.selection")
    except ImportError:
        return None
    needed_apis = getattr(core, "needed_apis", None)
    if needed_apis is None:
        return None
    try:
        from invariants.invariant_file import load_set

        invariant_set = load_set(document, source=str(path))
        apis = {str(api) for api in needed_apis(invariant_set)}
    except Exception as exc:  # the core validates; its message is the useful one
        raise SelectionError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from None
    return apis, _state_points(invariant_set)


def _state_points(invariant_set: Any) -> frozenset[str] | None:
    """Union of the snapshot points the invariants' templates read; None = cannot tell."""
    points: set[str] = set()
    try:
        for compiled in invariant_set.compiled:
            plan = compiled.template.needs(compiled.invariant.params)
            if plan.state_points is None:
                return None
            points.update(plan.state_points)
    except AttributeError:
        return None
    return frozenset(points)


def _strings_under_apis(node: Any) -> Iterable[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "apis" and isinstance(value, list):
                yield from (item for item in value if isinstance(item, str))
            else:
                yield from _strings_under_apis(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings_under_apis(item)
