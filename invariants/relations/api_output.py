"""APIOutput: a property of a call's return value.

``form = "constant"``       ``{"form": "constant", "api": "torch.nn.functional.linear",
    "prop": "dtype", "value": "torch.bfloat16"}`` if ``ctx.autocast = "torch.bfloat16"``
    — the output dtype under autocast; broken when autocast is silently dropped.
``form = "same_as_input"``  ``{"form": "same_as_input", "api": "torch.nn.Module.forward",
    "mtype": "Preprocessor", "arg": "0", "prop": "batch"}`` — shape-, dtype- or
    batch-size-preserving calls (``batch`` = leading dimension, judged only where the
    input has a batch: rank 2 or more); broken by a preprocessing step that silently
    collapses a batch.
``form = "bounded"``        ``{"form": "bounded", "api": "generate", "arg": "max_new_tokens",
    "out": "len"}`` — a numeric output never exceeds the argument that limits it.

Calls of ``torch.nn.Module.forward`` are keyed by module type (``mtype``): a rule about
a ``LayerNorm`` says nothing about a ``Conv2d``.  Inferred rules are keyed only on torch
layers (`identity.names_torch_behaviour`): a user's class name means nothing in another
program.  Two exceptions transfer across
pipelines.  A forward of a module holding no parameter whose tensor output has the
same rank (at least 2) as its tensor input ``"0"`` is also a site of the type-free rule
``{"form": "same_as_input", "api": "torch.nn.Module.forward", "arg": "0", "prop":
"batch"}`` — "a module that keeps the layout of its input keeps its samples":
preprocessing, normalisation and augmentation modules never add or drop samples,
whatever the user called them.  Modules that flatten, embed or pool change the rank;
models may regroup samples at the same rank (a graph readout, time merged into the
batch): neither is judged.
And a module forward given a *generation budget* keyword
(``max_new_tokens``, ``max_length``...) and returning integer token ids is also a site
of the type-free rule ``{"form": "bounded", "api": "torch.nn.Module.forward", "arg":
"max_new_tokens", "out": "last_dim"}`` — "generated sequences never exceed the budget
they were given", whatever the user's sampler class is called.  Keyword arguments of
``Module.forward`` come from the post event (`invariants.window`).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..events import MODULE_FORWARD
from ..window import FactPlan
from .base import Lazy, Mode, Site, Template
from .view import WindowView, freeze, is_number, is_scalar, thaw

CONSTANT_PROPS = ("dtype",)
#: ``batch`` is the leading dimension: preprocessing may pad or crop, never drop samples
INPUT_PROPS = ("shape", "dtype", "batch")
BOUND_WORDS = ("max", "limit")
#: keyword arguments that bound the length of generated token sequences in any pipeline
GENERATION_BUDGETS = frozenset({"max_new_tokens", "max_length", "max_len", "max_tokens", "max_gen_len"})
#: the least rank of an input that holds a batch (samples x features)
BATCH_KEEPING_MIN_RANK = 2


def _is_token_ids(ret: Any) -> bool:
    dtype = ret.get("dtype") if isinstance(ret, dict) else None
    return isinstance(dtype, str) and "int" in dtype and "bool" not in dtype


def _prop(summary: dict[str, Any], prop: str, *, is_input: bool = False) -> Any:
    if prop == "batch":
        # a 1-D input is one unbatched sample (an RL policy fed one state), not a batch
        shape = summary.get("shape")
        min_rank = BATCH_KEEPING_MIN_RANK if is_input else 1
        return shape[0] if isinstance(shape, list) and len(shape) >= min_rank and isinstance(shape[0], int) else None
    value = summary.get(prop)
    return value if value is None or is_scalar(value) else freeze(value)


def _tensor_shape(summary: Any) -> list | None:
    """The shape of a tensor summary (None for anything else)."""
    if not isinstance(summary, dict) or summary.get("T") != "tensor":
        return None
    shape = summary.get("shape")
    return shape if isinstance(shape, list) else None


#: the type-free batch rule: any module forward, input "0" and output of this rank or more
BATCH_KEEPING = ("same_as_input", MODULE_FORWARD, "", "0", "batch")


def _batch_keeping_site(view: WindowView, call: dict[str, Any], rank: int, stage: str, arg: Any, ret: Any,
                        checking: bool) -> Site | None:
    """The type-free "keeps its samples" site of one module forward, if it is one
    (callers ask only where the rule is wanted).

    Only same-rank calls count: a change of rank is a change of layout (flatten,
    embedding, pooling, ``(B, T, V) -> (B*T, V)`` logits), after which the leading
    dimension need not be the batch any more.  Rank-1 tensors are not judged either:
    their one dimension is as often a feature or token axis as a batch.
    """
    if (call.get("ctx") or {}).get("no_params") is not True:
        return None  # a model may regroup samples (graph readout, time merged into the batch)
    in_shape, out_shape = _tensor_shape(arg), _tensor_shape(ret)
    if in_shape is None or out_shape is None or len(in_shape) != len(out_shape) \
            or len(in_shape) < BATCH_KEEPING_MIN_RANK:
        return None
    before, after = in_shape[0], out_shape[0]  # the "batch" property
    if not isinstance(before, int) or not isinstance(after, int):
        return None
    holds = before == after
    if holds and checking:
        return None
    # Dropping samples is wrong in every stage, precision and grad mode: the site keeps no
    # context that references happened to share, which would only blind the rule elsewhere.
    records = Lazy(lambda: view.context_free_records(rank))
    evidence = {} if holds else {"call": call["key"], "module": call.get("module"), "mtype": call.get("mtype"),
                                 "input": before, "output": after}
    return Site(BATCH_KEEPING, holds, records, [rank], stage, evidence)


def _numeric_outputs(ret: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(ret, (int, float)) and not isinstance(ret, bool):
        out["value"] = ret
    elif isinstance(ret, list):
        out["len"] = len(ret)
    elif isinstance(ret, dict):
        shape = ret.get("shape")
        if isinstance(shape, list) and shape and all(isinstance(d, int) for d in shape):
            out["last_dim"] = shape[-1]
        if isinstance(ret.get("len"), int):
            out["len"] = ret["len"]
    return out


def _names_a_bound(arg_name: Any) -> bool:
    """An argument whose name says it limits something (``max_new_tokens``, ``limit``)."""
    if not isinstance(arg_name, str):
        return False
    lowered = arg_name.lower()
    return any(word in lowered for word in BOUND_WORDS)


def _call_sites(view: WindowView, call: dict[str, Any], rank: int, plan: "_CallPlan", mode: Mode,
                found: list[Site]) -> None:
    """Append the sites of one returned call in ``plan``'s families (checking skips the
    boolean ones that held).  Its sites share one call record, built on first use."""
    checking = mode.checking
    api = call["api"]
    mtype = call.get("mtype") or ""
    ret = call["ret"]
    stage = call.get("stage", "")
    args = call.get("args") or {}
    record = None
    if isinstance(ret, dict):
        for prop, family in plan.constant:
            value = ret.get(prop)
            if value is None or not is_scalar(value):
                continue
            if record is None:
                record = Lazy(lambda: [view.call_record(call, rank)])
            found.append(Site(family, frozenset([value]), record, [rank], stage,
                              lambda value=value: {"call": call["key"], "module": call.get("module"), "observed": value}))
        if plan.batch_keeping:
            site = _batch_keeping_site(view, call, rank, stage, args.get("0"), ret, checking)
            if site is not None:
                found.append(site)
        for arg_name, prop, family in plan.same_as_input:
            arg = args.get(arg_name)
            if not isinstance(arg, dict):
                continue
            before, after = _prop(arg, prop, is_input=True), _prop(ret, prop)
            if before is None or after is None:
                continue
            holds = before == after
            if holds and checking:
                continue
            if record is None:
                record = Lazy(lambda: [view.call_record(call, rank)])
            found.append(Site(family, holds, record, [rank], stage,
                              {} if holds else (lambda before=before, after=after: {
                                  "call": call["key"], "module": call.get("module"), "input": before, "output": after})))
    bound_args = plan.bound_args
    if bound_args is not None and bound_args.isdisjoint(args):
        return  # no argument a deployed bound is about
    limits = [(name, limit) for name, limit in args.items()
              if (bound_args is None or name in bound_args) and _names_a_bound(name) and is_number(limit)]
    outputs = _numeric_outputs(ret) if limits else None
    if not outputs:
        return
    families = mode.families
    for arg_name, limit in limits:
        scopes = [mtype]
        if mtype and api == MODULE_FORWARD and arg_name in GENERATION_BUDGETS and _is_token_ids(ret):
            scopes.append("")  # the type-free generation-budget rule
        for out_name, out_value in outputs.items():
            for scope in scopes:
                family = ("bounded", api, scope, arg_name, out_name)
                if checking and family not in families:
                    continue
                holds = out_value <= limit
                if holds and checking:
                    continue
                # A generation budget binds in every stage, precision and grad mode: the
                # type-free rule keeps no context one reference happened to sample in,
                # which would only blind it elsewhere.
                if scope and record is None:
                    record = Lazy(lambda: [view.call_record(call, rank)])
                site_records = record if scope else (lambda: view.context_free_records(rank))
                found.append(Site(family, holds, site_records, [rank], stage,
                                  {} if holds else {"call": call["key"], "module": call.get("module"),
                                                    "mtype": mtype, "limit": limit, out_name: out_value}))


class _CallPlan:
    """The families the sites of one returned call can belong to."""

    __slots__ = ("constant", "same_as_input", "batch_keeping", "bound_args")

    def __init__(self, constant: list[tuple[str, tuple]], same_as_input: list[tuple[str, str, tuple]],
                 batch_keeping: bool, bound_args: frozenset[str] | None) -> None:
        #: (property, family) of the output-constant rules
        self.constant = constant
        #: (argument, property, family) of the same-as-input rules
        self.same_as_input = same_as_input
        #: whether the type-free batch rule judges this call
        self.batch_keeping = batch_keeping
        #: names of the arguments bounded rules are about (None: any argument)
        self.bound_args = bound_args

    @classmethod
    def everything(cls, api: str, mtype: str, args: dict[str, Any]) -> "_CallPlan":
        """Inference: every family a call can be a site of."""
        return cls([(prop, ("constant", api, mtype, prop)) for prop in CONSTANT_PROPS],
                   [(name, prop, ("same_as_input", api, mtype, name, prop)) for name in args for prop in INPUT_PROPS],
                   api == MODULE_FORWARD and bool(mtype), None)


class _CheckPlan:
    """The deployed families as per-call lookups, built once per invariant set.

    A call is judged by the rules of its (api, module type); a module forward of a
    type no rule names only by the type-free rules (``mtype`` ""): keeping its batch
    and its generation budget.
    """

    __slots__ = ("apis", "by_pair", "type_free")

    def __init__(self, families: Any) -> None:
        self.apis = frozenset(f[1] for f in families)
        bound_args: dict[str, set[str]] = {}
        for family in families:
            if family[0] == "bounded":
                bound_args.setdefault(family[1], set()).add(family[3])
        batch_keeping = BATCH_KEEPING in families
        self.by_pair: dict[tuple[str, str], _CallPlan] = {}
        self.type_free: dict[str, _CallPlan] = {}
        for api, mtype in sorted({(f[1], f[2]) for f in families}):
            constant = [(prop, ("constant", api, mtype, prop)) for prop in CONSTANT_PROPS
                        if ("constant", api, mtype, prop) in families]
            same = [(f[3], f[4], f) for f in sorted(families) if f[0] == "same_as_input" and f[1:3] == (api, mtype)]
            bounds = frozenset(bound_args.get(api, ()))
            self.by_pair[(api, mtype)] = _CallPlan(constant, same, batch_keeping and api == MODULE_FORWARD and bool(mtype),
                                                   bounds)
            if not mtype:
                self.type_free[api] = _CallPlan([], [], batch_keeping and api == MODULE_FORWARD, bounds)

    def for_call(self, api: str, mtype: str) -> _CallPlan | None:
        """None: no deployed rule is about this call."""
        plan = self.by_pair.get((api, mtype))
        if plan is None and mtype:
            return self.type_free.get(api)
        return plan


class APIOutput(Template):
    relation = "APIOutput"

    def is_value_family(self, family: tuple) -> bool:
        return family[0] == "constant"

    def check_plan(self, families: Any) -> _CheckPlan:
        return _CheckPlan(families)

    def sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        checking, plan = mode.checking, mode.plan
        found: list[Site] = []
        for rank in view.ranks():
            if not checking:
                for call in view.calls(rank):
                    if "ret" in call and not call.get("exc"):
                        everything = _CallPlan.everything(call["api"], call.get("mtype") or "", call.get("args") or {})
                        _call_sites(view, call, rank, everything, mode, found)
                continue
            # checking: only calls of APIs and module types some deployed rule is about
            by_api = view.calls_by_api(rank)
            for api in plan.apis:
                for call in by_api.get(api, ()):
                    if "ret" not in call or call.get("exc"):
                        continue
                    call_plan = plan.for_call(api, call.get("mtype") or "")
                    if call_plan is not None:
                        _call_sites(view, call, rank, call_plan, mode, found)
        return iter(found)

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        form, api, mtype = family[0], family[1], family[2]
        if form == "constant":
            params = {"form": "constant", "api": api, "prop": family[3], "value": thaw(value)}
        elif form == "same_as_input":
            params = {"form": "same_as_input", "api": api, "arg": family[3], "prop": family[4]}
        else:
            params = {"form": "bounded", "api": api, "arg": family[3], "out": family[4]}
        if mtype:
            params["mtype"] = mtype
        return params

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        form = params["form"]
        api, mtype = str(params["api"]), str(params.get("mtype") or "")
        if form == "constant":
            return ("constant", api, mtype, str(params["prop"])), freeze(params["value"])
        if form == "same_as_input":
            if params["prop"] not in INPUT_PROPS:
                raise ValueError("prop")
            return ("same_as_input", api, mtype, str(params["arg"]), str(params["prop"])), None
        if form == "bounded":
            return ("bounded", api, mtype, str(params["arg"]), str(params["out"])), None
        raise ValueError("form")

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        args = set() if params["form"] == "constant" else {params["arg"]}
        return FactPlan(apis={params["api"]}, args={params["api"]: args}, state_points=set(), state_attrs=set())

    def describe(self, params: Mapping[str, Any]) -> str:
        form = params["form"]
        api = f"{params['api']} of a {params['mtype']}" if params.get("mtype") else params["api"]
        if form == "constant":
            return f"the output {params['prop']} of {api} is {params['value']!r}"
        if form == "same_as_input":
            what = "batch size (leading dimension)" if params["prop"] == "batch" else params["prop"]
            if params["api"] == MODULE_FORWARD and not params.get("mtype"):
                return (f"a module without parameters whose output has the rank of its argument "
                        f"{params['arg']!r} keeps its {what}: no preprocessing step drops or adds samples")
            return f"the output {what} of {api} equals the {what} of its argument {params['arg']!r}"
        return f"the output {params['out']} of {api} never exceeds its argument {params['arg']!r}"

    def hint(self, params: Mapping[str, Any]) -> str:
        if params["form"] == "constant":
            return "the call produced a different output type than in healthy runs: autocast/precision settings were lost or changed"
        if params["form"] == "same_as_input":
            if params["api"] == MODULE_FORWARD and not params.get("mtype"):
                return ("a module returned fewer or more samples than it was given: a preprocessing or "
                        "collation branch that collapses, truncates or repeats the batch")
            return "the output no longer matches its input: a reshaping or broadcasting bug, or a wrong batch size"
        return "the limit argument was ignored on this code path"

    def violation_evidence(self, params: Mapping[str, Any], site: Site) -> dict[str, Any]:
        if params["form"] == "constant":
            return dict(site.get_evidence(), expected=params["value"])
        return site.get_evidence()
