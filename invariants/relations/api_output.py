"""APIOutput: a property of a call's return value.

``form = "constant"``       ``{"form": "constant", "api": "torch.nn.functional.linear",
    "prop": "dtype", "value": "torch.bfloat16"}`` if ``ctx.autocast = "torch.bfloat16"``
    — the output dtype under autocast; broken when autocast is silently dropped.
``form = "same_as_input"``  ``{"form": "same_as_input", "api": "torch.nn.functional.relu",
    "arg": "input", "prop": "shape"}`` — shape-preserving operations.
``form = "bounded"``        ``{"form": "bounded", "api": "generate", "arg": "max_new_tokens",
    "out": "len"}`` — a numeric output never exceeds the argument that limits it.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..window import FactPlan
from .base import Site, Template, WindowView, freeze, is_scalar, lazy, thaw

CONSTANT_PROPS = ("dtype",)
INPUT_PROPS = ("shape", "dtype")
BOUND_WORDS = ("max", "limit")


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


class APIOutput(Template):
    relation = "APIOutput"

    def is_value_family(self, family: tuple) -> bool:
        return family[0] == "constant"

    def sites(self, view: WindowView, families: Any = None) -> Iterator[Site]:
        wanted = None if families is None else {f[1] for f in families}
        for rank in view.ranks():
            for call in view.calls(rank):
                if "ret" not in call or call.get("exc"):
                    continue
                api = call["api"]
                if wanted is not None and api not in wanted:
                    continue
                ret = call["ret"]
                record = lazy(lambda call=call, rank=rank: [view.call_record(call, rank)])
                if isinstance(ret, dict):
                    for prop in CONSTANT_PROPS:
                        value = ret.get(prop)
                        family = ("constant", api, prop)
                        if value is None or not is_scalar(value) or (families is not None and family not in families):
                            continue
                        yield Site(family, frozenset([value]), record, [rank], call.get("stage", ""),
                                   {"call": call["key"], "observed": value})
                args = call.get("args") or {}
                if isinstance(ret, dict):
                    for arg_name, arg in args.items():
                        if not isinstance(arg, dict):
                            continue
                        for prop in INPUT_PROPS:
                            family = ("same_as_input", api, arg_name, prop)
                            if prop not in arg or prop not in ret or (families is not None and family not in families):
                                continue
                            holds = arg[prop] == ret[prop]
                            if holds and families is not None:
                                continue
                            yield Site(family, holds, record, [rank], call.get("stage", ""),
                                       {} if holds else {"call": call["key"], "input": arg[prop], "output": ret[prop]})
                outputs = _numeric_outputs(ret)
                if outputs:
                    for arg_name, limit in args.items():
                        if not any(w in arg_name.lower() for w in BOUND_WORDS):
                            continue
                        if not isinstance(limit, (int, float)) or isinstance(limit, bool):
                            continue
                        for out_name, out_value in outputs.items():
                            family = ("bounded", api, arg_name, out_name)
                            if families is not None and family not in families:
                                continue
                            holds = out_value <= limit
                            if holds and families is not None:
                                continue
                            yield Site(family, holds, record, [rank], call.get("stage", ""),
                                       {} if holds else {"call": call["key"], "limit": limit, out_name: out_value})

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        if family[0] == "constant":
            return {"form": "constant", "api": family[1], "prop": family[2], "value": thaw(value)}
        if family[0] == "same_as_input":
            return {"form": "same_as_input", "api": family[1], "arg": family[2], "prop": family[3]}
        return {"form": "bounded", "api": family[1], "arg": family[2], "out": family[3]}

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        form = params["form"]
        if form == "constant":
            return ("constant", str(params["api"]), str(params["prop"])), freeze(params["value"])
        if form == "same_as_input":
            return ("same_as_input", str(params["api"]), str(params["arg"]), str(params["prop"])), None
        if form == "bounded":
            return ("bounded", str(params["api"]), str(params["arg"]), str(params["out"])), None
        raise ValueError("form")

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        args = set() if params["form"] == "constant" else {params["arg"]}
        return FactPlan(apis={params["api"]}, args={params["api"]: args}, state_points=set(), state_attrs=set())

    def describe(self, params: Mapping[str, Any]) -> str:
        form = params["form"]
        if form == "constant":
            return f"the output {params['prop']} of {params['api']} is {params['value']!r}"
        if form == "same_as_input":
            return f"the output {params['prop']} of {params['api']} equals the {params['prop']} of its argument {params['arg']!r}"
        return f"the output {params['out']} of {params['api']} never exceeds its argument {params['arg']!r}"

    def hint(self, params: Mapping[str, Any]) -> str:
        if params["form"] == "constant":
            return "the call produced a different output type than in healthy runs: autocast/precision settings were lost or changed"
        if params["form"] == "same_as_input":
            return "the output no longer matches its input: a reshaping or broadcasting bug, or a wrong batch size"
        return "the limit argument was ignored on this code path"

    def violation_evidence(self, params: Mapping[str, Any], site: Site) -> dict[str, Any]:
        if params["form"] == "constant":
            return dict(site.evidence, expected=params["value"])
        return site.evidence
