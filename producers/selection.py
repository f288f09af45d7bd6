"""Which APIs a producer records: the curated default set, a list file, or invariants.

Selective instrumentation is what keeps the overhead low: everything not selected
returns through a single set lookup.  ``-i FILE`` accepts

* a plain text file of API family names, one per line, ``#`` starts a comment; every
  name must be one the producer can record (`is_known_api`);
* an invariants JSON file, validated by the invariants core, whose
  ``invariants.selection.needed_apis`` decides.

Names are the stable *family* names events carry in their ``api`` field (e.g.
``torch.optim.Optimizer.step``), so a selection learnt on one model transfers to
another.  Parameter snapshots are taken when the optimizer step or zero_grad
families are selected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invariants.events import (
    BACKWARD_APIS,
    CLIP_GRAD_NORM,
    DATALOADER_EPOCH,
    GRAD_CLEAR_API,
    MODULE_EVAL,
    MODULE_FORWARD,
    MODULE_LOAD_STATE_DICT,
    MODULE_TRAIN,
    MODULE_ZERO_GRAD,
    OPTIMIZER_STEP,
    SCHEDULER_STEP,
    OPTIMIZER_ZERO_GRAD,
    PARAM_OVERWRITE,
    WORKER_INIT_API,
)

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
#: loss functions (nn.*Loss modules call these): what they are given is checked
LOSS_FUNCTIONS = tuple(
    f"torch.nn.functional.{name}"
    for name in (
        "cross_entropy", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div",
        "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "ctc_loss", "multilabel_soft_margin_loss",
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
        GRAD_CLEAR_API,
        MODULE_TRAIN,
        MODULE_EVAL,
        MODULE_FORWARD,
        *BACKWARD_APIS,
        CLIP_GRAD_NORM,
        MODULE_LOAD_STATE_DICT,
        DATALOADER_EPOCH,
        "torch.autocast.__enter__",
        "torch.save",
        SCHEDULER_STEP,
        "torch.manual_seed",
        WORKER_INIT_API,
        PARAM_OVERWRITE,
        *DROPOUT_FUNCTIONS,
        *INIT_FUNCTIONS,
        *LOSS_FUNCTIONS,
        *COLLECTIVES,
    }
)


_DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


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
    """Read ``-i FILE``; raises `SelectionError` with a one-line reason.

    A file that starts like JSON must be a valid invariants file; anything else must be
    a list of API family names this build can record.  Either way a mistake is an
    error, not a selection that silently records too little: the invariants checked
    later would then report violations the training never committed.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SelectionError(f"cannot read {path}: {exc.strerror or exc}") from None
    points: frozenset[str] | None = None
    if data.lstrip().startswith((b"{", b"[")):
        apis, points = _apis_from_invariants(data, path)
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SelectionError(f"{path} is not a UTF-8 text file") from None
        apis = _apis_from_list(text, path)
    if not apis:
        raise SelectionError(f"{path} names no API to instrument")
    # Step boundaries come from optimizer hooks, so those are always on.
    return Selection(apis=frozenset(apis) | {OPTIMIZER_STEP}, full=full, source=str(path), state_points=points)


def _apis_from_list(text: str, path: Path) -> set[str]:
    apis: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if name:
            apis.setdefault(name, number)
    unknown = [(name, number) for name, number in apis.items() if not is_known_api(name)]
    if unknown:
        listed = ", ".join(f"{name[:60]!r} (line {number})" for name, number in unknown[:3])
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        raise SelectionError(f"{path}: not an API family this build can record: {listed}{more} "
                             f"(expected one name per line, e.g. {OPTIMIZER_ZERO_GRAD}, or an invariants JSON file)")
    return set(apis)


def is_known_api(name: str) -> bool:
    """A family the producer records: a default one, or one a hook, a wrapper or the
    torch function mode records (a ``torch.*`` function or ``torch.Tensor`` method)."""
    if name in DEFAULT_APIS:
        return True
    if not _DOTTED_NAME.fullmatch(name):
        return False
    from .interception import recordable  # imports torch: only for names outside the defaults

    return recordable(name)


def _apis_from_invariants(data: bytes, path: Path) -> tuple[set[str], frozenset[str] | None]:
    """What an invariant set needs recorded, as the invariants core computes it."""
    from invariants.invariant_file import InvariantFileError, load_set
    from invariants.selection import needed_apis

    try:
        invariant_set = load_set(data, source=str(path))
    except InvariantFileError as exc:
        raise SelectionError(str(exc)) from None
    return set(needed_apis(invariant_set)), _state_points(invariant_set)


def _state_points(invariant_set: Any) -> frozenset[str] | None:
    """Union of the snapshot points the invariants' templates read; None = cannot tell."""
    points: set[str] = set()
    for compiled in invariant_set.compiled:
        plan = compiled.template.needs(compiled.invariant.params)
        if plan.state_points is None:
            return None
        points.update(plan.state_points)
    return frozenset(points)
