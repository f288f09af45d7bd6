"""EventContain: an API call contains a child event.

``form = "state"``  the call changes a variable in a fixed way, judged from the
    snapshots taken right before and after that very call (same call id):
    ``{"form": "state", "api": "torch.optim.Optimizer.step", "attr": "data_digest", "effect": "changes"}``
    if ``has_grad = True`` — "the optimizer step changes every parameter that has a
    gradient".  Effects: ``changes`` / ``preserves`` (digest differs / is equal) and
    ``cleared`` (the gradient is None or all zero afterwards, for ``zero_grad``).  A
    parameter left unchanged while its gradient is below 1e-4 of its norm is not judged
    (float32 weights may not move); one without any gradient is.
    ``effect = "changes_some"`` is the per-*call* form: "each call of ``Optimizer.step``
    changes at least one of the parameters it applies to".  It survives what the
    per-parameter form cannot (frozen parameters, conv biases before BatchNorm whose
    update is below float resolution) and still catches an optimizer over parameters
    that get no gradient, or one whose step silently updates nothing.  A call whose
    parameters all have gradients too small to move their weights is not judged.
``form = "call"``   the call contains another recorded call, optionally with given
    argument values: ``{"form": "call", "api": "torch.nn.Module.forward", "mtype": "Dropout",
    "child": "torch.nn.functional.dropout", "args": {"training": false}}`` if ``stage = eval``.
    Inferred argument values are flags only: ``p = 0.5`` is a hyperparameter, not a law.
    Layers with a fused inference path (`identity.FAST_PATH_LAYERS`) are not judged in
    evaluation mode without gradients: there torch may run a ``TransformerEncoderLayer``
    as one native kernel that calls none of its sub-layers.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

from ..window import FactPlan
from .base import Lazy, Mode, Site, Template, reportable
from .identity import may_take_fast_path
from .view import SIGNIFICANT_GRAD_RATIO, SnapshotRecord, WindowView, freeze, is_scalar, thaw

STATE_EFFECTS = (("data_digest", "changes"), ("data_digest", "preserves"), ("grad_digest", "cleared"))
#: per-call effects: one site per call, judged over all the variables it snapshots
CALL_EFFECTS = (("data_digest", "changes_some"),)
MAX_CHILD_ARGS = 6


def _negligible_grad(attrs: Mapping[str, Any]) -> bool:
    """A gradient present but many orders of magnitude below its weights (a conv bias
    feeding BatchNorm): the step may leave float32 weights bit-identical."""
    grad, data = attrs.get("grad_norm"), attrs.get("data_norm")
    if attrs.get("grad_digest") is None or not isinstance(grad, (int, float)) or not isinstance(data, (int, float)):
        return False
    return grad <= SIGNIFICANT_GRAD_RATIO * data


def _cleared(attrs: Mapping[str, Any]) -> bool:
    if attrs.get("grad_digest") is None:
        return True
    norm = attrs.get("grad_norm")
    return isinstance(norm, (int, float)) and norm == 0


def _effects(api: str, wants: Callable[[tuple], bool]) -> tuple[list[tuple[str, str, tuple]], list[tuple[str, str]]]:
    """(attr, effect, family) of the per-variable effects and (attr, effect) of the
    per-call effects judged at calls of ``api``, of the families ``wants`` accepts."""
    variable = [(a, e, ("state", api, a, e)) for a, e in STATE_EFFECTS if wants(("state", api, a, e))]
    per_call = [(a, e) for a, e in CALL_EFFECTS if wants(("state", api, a, e))]
    return variable, per_call


class _CheckPlan:
    """The deployed families as lookups, built once per invariant set."""

    __slots__ = ("state", "call_apis")

    def __init__(self, families: Any) -> None:
        #: api -> the effects of `_effects` that deployed rules name (APIs with none left out)
        self.state = {f[1]: _effects(f[1], families.__contains__) for f in families if f[0] == "state"}
        #: the APIs of the call-form families
        self.call_apis = frozenset(f[1] for f in families if f[0] == "call")


class EventContain(Template):
    relation = "EventContain"

    def is_value_family(self, family: tuple) -> bool:
        return family[0] == "call"

    def check_plan(self, families: Any) -> "_CheckPlan":
        return _CheckPlan(families)

    def sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        yield from self._state_sites(view, mode)
        yield from self._call_sites(view, mode)

    # ------------------------------------------------------------------ state changes
    def _state_sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        checking, plan = mode.checking, mode.plan
        for rank in view.ranks():
            states = view.facts(rank).states
            for at, per_call in states.items():
                if not at.startswith("pre:"):
                    continue
                api = at[4:]
                if not checking:
                    wanted, per_call_wanted = _effects(api, mode.wants)
                else:  # the effects deployed rules name for this API
                    effects = plan.state.get(api)
                    if effects is None:
                        continue
                    wanted, per_call_wanted = effects
                post_calls = states.get("post:" + api) or {}
                for call_key, before in per_call.items():
                    after = post_calls.get(call_key)
                    if not after:
                        continue
                    for attr, effect in per_call_wanted:
                        site = _changes_some_site(view, rank, api, attr, effect, call_key, before, after,
                                                  lambda fact, call_key=call_key, api=api, rank=rank:
                                                  _call_fact(view, rank, api, call_key, fact))
                        if site is not None and not (site.observed and checking):
                            yield site
                    if wanted:
                        yield from self._variable_sites(view, rank, call_key, before, after, wanted, mode)

    @staticmethod
    def _variable_sites(view: WindowView, rank: int, call_key: str, before: Mapping[str, Any],
                        after: Mapping[str, Any], wanted: list[tuple[str, str, tuple]], mode: Mode) -> list[Site]:
        """Per-variable sites of one call.  Checking skips the effects that held and the
        failures no deployed rule's precondition accepts (see `reportable`)."""
        checking, families = mode.checking, mode.families
        first_step = view.step == 0
        found: list[Site] = []
        for name, pre_attrs in before.items():
            post_attrs = after.get(name)
            if post_attrs is None:
                continue
            record = None  # one record per variable, shared by its effects
            for attr, effect, family in wanted:
                if effect == "cleared":
                    if "grad_digest" not in post_attrs:
                        continue
                    holds = _cleared(post_attrs)
                else:
                    if attr not in pre_attrs or attr not in post_attrs:
                        continue
                    same = pre_attrs[attr] == post_attrs[attr]
                    if same and effect == "changes" and _negligible_grad(pre_attrs):
                        continue  # an update below float resolution proves nothing either way
                    holds = (not same) if effect == "changes" else same
                if holds and checking:
                    continue
                if record is None:
                    record = [SnapshotRecord(pre_attrs, rank, first_step)] if checking else Lazy(
                        lambda pre_attrs=pre_attrs: [view.state_record(pre_attrs, rank)])
                if checking and not reportable(families, family, record):
                    continue
                found.append(Site(  # positional: one per failing variable
                    family,
                    holds,
                    record,
                    [rank],
                    pre_attrs.get("stage", ""),
                    {} if holds else (
                        lambda name=name, pre_attrs=pre_attrs, post_attrs=post_attrs, attr=attr: {
                            "variable": name, "call": call_key,
                            "before": _attr_summary(pre_attrs, attr), "after": _attr_summary(post_attrs, attr),
                        }),
                ))
        return found

    # ------------------------------------------------------------------ child calls
    def _call_sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        checking, families = mode.checking, mode.families
        # checking: the APIs some deployed rule is about
        apis = mode.plan.call_apis if checking else None
        if apis is not None and not apis:
            return
        for rank in view.ranks():
            if apis is None:
                calls = view.calls(rank)
            else:  # families are per API, so each still sees its calls in order
                by_api = view.calls_by_api(rank)
                calls = [call for api in apis if api in by_api for call in by_api[api]]
            for call in calls:
                if not call.get("done"):
                    continue
                api = call["api"]
                family = ("call", api, call.get("mtype") or "")
                if checking and family not in families:
                    continue
                if may_take_fast_path(call):
                    continue
                children = view.children(rank)  # cached per rank by the view
                observed: set[Any] = set()
                for child in children.get(call["key"], ()):
                    observed.add(("api", child["api"]))
                    args = child.get("args") or {}
                    for name in sorted(args)[:MAX_CHILD_ARGS]:
                        value = args[name]
                        if is_scalar(value):
                            observed.add(("arg", child["api"], name, value))
                yield Site(
                    family=family,
                    observed=frozenset(observed),
                    records=lambda call=call, rank=rank: [view.call_record(call, rank)],
                    ranks=[rank],
                    stage=call.get("stage", ""),
                    evidence=lambda call=call, children=children: {
                        "call": call["key"], "module": call.get("module"),
                        "children": sorted({c["api"] for c in children.get(call["key"], ())})},
                )

    # ------------------------------------------------------------------ invariant plumbing
    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        if family[0] == "state":
            return {"form": "state", "api": family[1], "attr": family[2], "effect": family[3]}
        params: dict[str, Any] = {"form": "call", "api": family[1], "child": value[1]}
        if family[2]:
            params["mtype"] = family[2]
        if value[0] == "arg":
            params["args"] = {value[2]: thaw(value[3])}
        return params

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        form = params["form"]
        if form == "state":
            if (params["attr"], params["effect"]) not in STATE_EFFECTS + CALL_EFFECTS:
                raise ValueError("effect")
            return ("state", str(params["api"]), params["attr"], params["effect"]), None
        if form == "call":
            family = ("call", str(params["api"]), str(params.get("mtype") or ""))
            args = params.get("args")
            if args:
                if not isinstance(args, dict) or len(args) != 1:
                    raise ValueError("args")
                (name, value), = args.items()
                return family, ("arg", str(params["child"]), name, freeze(value))
            return family, ("api", str(params["child"]))
        raise ValueError("form")

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        if params["form"] == "state":
            api = params["api"]
            attrs = {params["attr"], "grad_digest", "grad_norm", "data_norm"}
            # the call itself: whether a backward had run before it (`_before_any_backward`)
            return FactPlan(apis={api}, state_points={f"pre:{api}", f"post:{api}"}, state_attrs=attrs)
        child = params["child"]
        args = params.get("args") or {}
        return FactPlan(apis={params["api"], child}, args={params["api"]: set(), child: set(args)},
                        state_points=set(), state_attrs=set(), links=True)

    def describe(self, params: Mapping[str, Any]) -> str:
        api = params["api"]
        if params["form"] == "state":
            if params["effect"] == "changes_some":
                return f"every call of {api} changes the data of at least one of the parameters it applies to"
            effect = {"changes": "changes", "preserves": "leaves unchanged", "cleared": "clears (None or zero)"}[params["effect"]]
            what = "data" if params["attr"] == "data_digest" else "gradient"
            return f"every call of {api} {effect} the {what} of the parameters it applies to"
        where = f"{api} of a {params['mtype']}" if params.get("mtype") else api
        args = params.get("args")
        child = params["child"] + (f" with {', '.join(f'{k}={v!r}' for k, v in args.items())}" if args else "")
        return f"{where} calls {child} inside it"

    def hint(self, params: Mapping[str, Any]) -> str:
        if params["form"] == "state":
            if params["effect"] == "changes_some":
                return ("the optimizer step updated nothing: it was built over parameters that receive no gradient "
                        "(e.g. the frozen part of the model instead of the trainable one), its learning rate is zero, "
                        "or its update path skips every parameter (gradients lost or a stale plan after set_to_none)")
            if params["effect"] == "changes":
                return ("the optimizer did not update this parameter: it is not in the optimizer's param groups, "
                        "it is frozen, the learning rate is zero, or its gradient was lost before the step")
            if params["effect"] == "cleared":
                return "gradients were not reset: zero_grad is called on a different optimizer/model, or not at all"
            return "the call modified state it normally leaves alone"
        return ("the expected inner call is missing or uses different arguments: a code path was skipped "
                "(e.g. a module in the wrong train/eval mode, a wrapper bypassed)")

    def keeps_hypothesis(self, params: Mapping[str, Any]) -> bool:
        # a flag of the inner call (``training``) is behaviour; a number or a name
        # (dropout ``p``, a mode) is one author's configuration, not a law
        args = params.get("args")
        return not args or all(isinstance(value, bool) for value in args.values())

    def violation_evidence(self, params: Mapping[str, Any], site: Site) -> dict[str, Any]:
        if params["form"] == "state":
            return site.get_evidence()
        expected = params["child"] + (f" {params['args']}" if params.get("args") else "")
        return dict(site.get_evidence(), expected=expected)


def _call_fact(view: WindowView, rank: int, api: str, call_key: str, fact: str) -> Any:
    """A fact the call carries: ``backprop`` (a backward ran in its process before it),
    ``trained`` (its optimizer stepped before)."""
    for call in view.calls_by_api(rank).get(api, ()):
        if call.get("key") == call_key:
            return call.get(fact)
    return None


def _changes_some_site(view: WindowView, rank: int, api: str, attr: str, effect: str, call_key: str,
                       before: Mapping[str, Any], after: Mapping[str, Any],
                       call_fact: Callable[[str], Any]) -> Site | None:
    """One per-call site: did the call change ``attr`` of at least one variable?

    A step with no gradient to apply before any backward ran in the process updates
    nothing by design: a framework still calls ``step`` for a batch the training step
    skipped (Lightning when ``training_step`` returns None, as a first batch that only
    initialises data-dependent layers does).  A step without gradients *after*
    backwards ran is judged: an optimizer left holding a discarded model's tensors.
    Nor is an optimizer's first step that had gradients and changed nothing judged: a
    warm-up from 0 written inside the optimizer's own update (BertAdam scales its rate by
    the schedule in ``step``, so the groups' ``lr`` is not 0) starts with an update of
    nothing; an optimizer that never updates anything is reported at its second step, and
    one whose parameters get no gradient at all (frozen by mistake) at its first."""
    compared = with_grad = significant = 0
    changed = False
    first = None
    for name, pre_attrs in before.items():
        post_attrs = after.get(name)
        if post_attrs is None or attr not in pre_attrs or attr not in post_attrs:
            continue
        if first is None:
            first = pre_attrs
        compared += 1
        if pre_attrs.get("grad_digest") is not None:
            with_grad += 1
            if not _negligible_grad(pre_attrs):
                significant += 1
        if pre_attrs[attr] != post_attrs[attr]:
            changed = True
    if first is None:
        return None
    if not changed and with_grad and not significant:
        return None  # every gradient is below what can move float32 weights: proves nothing
    if not changed and not with_grad and call_fact("backprop") is False:
        return None
    if not changed and with_grad and call_fact("trained") is False:
        return None
    return Site(
        family=("state", api, attr, effect),
        observed=changed,
        records=Lazy(lambda: [_call_state_record(view, first, rank)]),
        ranks=[rank],
        stage=first.get("stage", ""),
        evidence={} if changed else (lambda: {
            "call": call_key, "parameters": compared, "with_gradient": with_grad,
            "with_significant_gradient": significant, "unchanged": sorted(before)[:4],
        }),
    )


def _call_state_record(view: WindowView, attrs: Mapping[str, Any], rank: int) -> dict[str, Any]:
    """Precondition record of a per-call site: only call-level fields (stage, rank, first
    step), never one parameter's attributes, which would not describe the whole call."""
    return {"stage": attrs.get("stage", ""), "rank": rank, "step_is_first": view.step == 0}


def _attr_summary(attrs: Mapping[str, Any], attr: str) -> dict[str, Any]:
    out = {attr: attrs.get(attr)}
    for extra in ("grad_norm", "data_norm"):
        if extra in attrs:
            out[extra] = attrs[extra]
    return out
