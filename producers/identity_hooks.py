"""Interception points that tell the tracer which objects exist and what touches them.

* Every parameter any module registers (the official global registration hook), so
  that a write through ``module.weight.data`` is known to be a write to a parameter
  even before the model has run forward.
* Every optimizer at construction, so that the first iteration of a program that
  clears gradients through ``Module.zero_grad`` already knows an optimizer step is
  coming (gradient accumulation is then not mistaken for iterations).
* In-place writes that initialise a parameter outside an optimizer step (``normal_``,
  ``zero_``, ``fill_``...; how many model libraries initialise weights): recorded as
  ``torch.Tensor.param_overwrite`` calls, which mean "this parameter was
  (re)initialised", like ``torch.nn.init.*``, and say whether the target held learned
  values (``learned``).  Optimizers write their parameters in place too; inside their
  step nothing is recorded.  ``copy_`` is not an initialiser: it synchronises (loading
  a state dict, a target network's soft update, an EMA swap before evaluation), which
  healthy programs do at any stage, so it is not recorded.
* Every ``Module.load_state_dict``: the parameters it filled from the state dict hold
  learned values from then on, so an initialiser that runs after the load (a model's
  own ``init_weights`` called once too often) is known to destroy them.  The load is
  recorded with its contract ``replaces_weights`` (see `_replaces_weights`), and
  compared with what its parameters held before their first update
  (`producers.weight_rewinds`), as is every ``Optimizer.load_state_dict`` after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

from invariants.events import MODULE_LOAD_STATE_DICT, PARAM_OVERWRITE

from .grad_clears import grad_property, hand_clear_allowed, load_dynamo_before_grad_is_replaced
from .ownership import deliberate_reset
from .patching import patch_attribute, patch_property

if TYPE_CHECKING:
    from .tracer import Tracer

#: in-place methods that replace a tensor's values wholesale
OVERWRITING_METHODS = (
    "normal_", "uniform_", "zero_", "fill_", "random_", "bernoulli_",
    "exponential_", "log_normal_", "cauchy_", "geometric_",
)


class _RegistrationHandle:
    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def remove(self) -> None:
        self._handle.remove()


def install_identity_hooks(tracer: "Tracer", record_writes: bool, record_clears: bool) -> list[Any]:
    from torch.nn.modules.module import register_module_parameter_registration_hook

    handles: list[Any] = [
        _RegistrationHandle(register_module_parameter_registration_hook(_registration_hook(tracer))),
        patch_attribute(torch.optim.Optimizer, "__init__", _optimizer_init(tracer)),
        patch_attribute(torch.optim.Optimizer, "load_state_dict", _optimizer_load_state_dict(tracer)),
        patch_attribute(torch.nn.Module, "load_state_dict", _load_state_dict(tracer)),
    ]
    if record_writes:
        handles.extend(
            patch_attribute(torch.Tensor, method, _overwrite(tracer, method)) for method in OVERWRITING_METHODS
        )
    if record_clears:
        load_dynamo_before_grad_is_replaced()
        handles.append(patch_property(torch.Tensor, "grad", lambda descriptor: grad_property(tracer, descriptor)))
        if not record_writes:
            handles.append(patch_attribute(torch.Tensor, "zero_", _overwrite(tracer, "zero_", record_writes=False)))
    return handles


def _registration_hook(tracer: "Tracer") -> Callable[[torch.nn.Module, str, Any], None]:
    def parameter_registered(module: torch.nn.Module, name: str, param: Any) -> None:
        if tracer.enabled and isinstance(param, torch.Tensor):
            try:
                tracer.ownership.remember(param)
            except Exception as exc:
                tracer.internal_error("parameter registration hook", exc)

    return parameter_registered


def _optimizer_init(tracer: "Tracer") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            if tracer.enabled:
                try:
                    tracer.ownership.optimizer_seen(self, tracer.registry.add_optimizer(self))
                    tracer.contracts.restarts.constructed(self)
                except Exception as exc:
                    tracer.internal_error("optimizer construction", exc)

        return init

    return make


def _optimizer_load_state_dict(tracer: "Tracer") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def load_state_dict(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            if tracer.enabled:
                try:
                    tracer.contracts.rewinds.state_restored(self)
                    tracer.contracts.eval_weights.state_loaded(self)
                    tracer.contracts.schedule_resumes.optimizer_loaded(self)
                    tracer.contracts.resumed_weights.optimizer_loaded(self)
                    tracer.contracts.resumed_freezes.optimizer_loaded(self)
                except Exception as exc:
                    tracer.internal_error("optimizer state load", exc)
            return result

        return load_state_dict

    return make


def _load_state_dict(tracer: "Tracer") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def load_state_dict(self: torch.nn.Module, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
            if not tracer.enabled:
                return original(self, state_dict, *args, **kwargs)
            outermost = tracer.enter_group("load_state_dict")  # a subclass's own load calling super()
            token = None
            try:
                try:
                    placeholders = _meta_parameter_names(self)
                    before = tracer.contracts.rewinds.before_load(self) if outermost else []
                    if outermost and tracer.selection.wants(MODULE_LOAD_STATE_DICT) and not tracer.skip_compiled():
                        token = _begin_load(tracer, self, state_dict)
                except Exception as exc:
                    tracer.internal_error("state dict load", exc)
                    return original(self, state_dict, *args, **kwargs)
                try:
                    result = original(self, state_dict, *args, **kwargs)
                except BaseException as exc:
                    tracer.end_call(token, exc=exc)
                    raise
                tracer.end_call(token)
                try:
                    loaded = _loaded_parameters(self, state_dict, placeholders)
                    tracer.ownership.loaded(loaded)
                    tracer.contracts.resumed_weights.loaded(_loaded_parameters(self, state_dict, set()))
                    if outermost:
                        tracer.contracts.averaged_copies.loaded_from(self, state_dict)
                    tracer.contracts.restarts.restored(loaded)
                    tracer.contracts.rewinds.after_load(before)
                except Exception as exc:
                    tracer.internal_error("state dict load", exc)
                return result
            finally:
                if outermost:
                    tracer.leave_group("load_state_dict")

        return load_state_dict

    return make


def _begin_load(tracer: "Tracer", module: torch.nn.Module, state_dict: Any) -> Any:
    cls = type(module)
    replaces = _replaces_weights(module, state_dict)
    return tracer.begin_call(
        MODULE_LOAD_STATE_DICT, f"{cls.__module__}.{cls.__qualname__}.load_state_dict", {},
        extra=tracer.module_call_extra(module, MODULE_LOAD_STATE_DICT),
        contract=None if replaces is None else {"replaces_weights": replaces},
    )


def _replaces_weights(module: torch.nn.Module, state_dict: Any) -> bool | None:
    """Whether the load gives the module at least one tensor that is not its own already.

    A checkpoint whose keys all miss (DDP's ``module.`` prefix loaded with
    ``strict=False``), or a state dict that is the module's own (merged into
    ``model.state_dict()`` before loading, or a "best" state kept without copying)
    restores nothing and raises nothing.  Judged by name against the module's
    parameters and persistent buffers and by storage for the names that match; None
    (not judged) where the module or a submodule rewrites keys with load hooks (FSDP,
    some model libraries), or holds no state.
    """
    if not hasattr(state_dict, "get") or any(
        getattr(sub, "_load_state_dict_pre_hooks", None) for sub in module.modules()
    ):
        return None
    own = dict(module.named_parameters(remove_duplicate=False))
    own.update(module.named_buffers(remove_duplicate=False))
    if not own:
        return None
    for name, mine in own.items():
        given = state_dict.get(name)
        if not isinstance(given, torch.Tensor) or not isinstance(mine, torch.Tensor):
            continue
        if mine.device.type == "meta" or given.device != mine.device or not mine.numel():
            return True
        if given.data_ptr() != mine.data_ptr():
            return True
    return False


def _meta_parameter_names(module: torch.nn.Module) -> set[str]:
    return {name for name, param in module.named_parameters(remove_duplicate=False) if param.device.type == "meta"}


def _loaded_parameters(module: torch.nn.Module, state_dict: Any, placeholders: set[str]) -> list[torch.Tensor]:
    """The parameters whose names the state dict has (read after the load: ``assign=True``
    replaces them).  A key missing from a partial checkpoint (``strict=False``) leaves
    its parameter as it was, to be initialised as a new one.

    A parameter that was on the meta device had no values yet: loading into it is how
    models built without memory get their storage, and libraries use that path for
    placeholders they initialise next as well as for checkpoint values (Transformers'
    ``from_pretrained`` loads ``torch.empty`` tensors into the keys the checkpoint
    lacks).  Such loads are not counted, which misses an initialiser run after
    ``from_pretrained`` rather than flag the initialisation of a new head."""
    keys = set(state_dict.keys())
    return [param for name, param in module.named_parameters(remove_duplicate=False)
            if name in keys and name not in placeholders]


def _overwrite(
    tracer: "Tracer", method: str, record_writes: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    name = f"torch.Tensor.{method}"
    clears_gradients = method == "zero_"

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def overwrite(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling() or not tracer.enabled or tracer.busy or tracer.in_optimizer_step:
                return original(self, *args, **kwargs)
            param = tracer.ownership.parameter_of(self)
            if param is None and clears_gradients:
                _note_gradient_zeroed(tracer, self)
            if param is None or not record_writes or not tracer.enter_group("init"):  # nn.init.* records itself
                return original(self, *args, **kwargs)
            try:
                trained = tracer.ownership.is_trained(param)
                learned = trained or (tracer.ownership.holds_learned(param) and not deliberate_reset())
                extra = {"trained": trained, "learned": learned}
                token = tracer.begin_call(PARAM_OVERWRITE, name, {"tensor": param}, extra=extra)
                try:
                    result = original(self, *args, **kwargs)
                except BaseException as exc:
                    tracer.end_call(token, exc=exc)
                    raise
                tracer.end_call(token, None)
                return result
            finally:
                tracer.leave_group("init")

        return overwrite

    return make


def _note_gradient_zeroed(tracer: "Tracer", tensor: torch.Tensor) -> None:
    """``param.grad.zero_()`` by user code is a hand clear of ``param``'s gradient."""
    try:
        if hand_clear_allowed(tracer):
            param = tracer.hand_clears.param_of_grad(tensor, tracer.ownership.known_parameters)
            if param is not None:
                tracer.grad_cleared_by_hand(param)
    except Exception as exc:
        tracer.internal_error("gradient clear", exc)
