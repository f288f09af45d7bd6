"""LossArguments: what a loss function is given, judged by torch's contract for that loss.

``form = "not_probabilities"``  ``{"form": "not_probabilities", "api":
    "torch.nn.functional.cross_entropy", "arg": "input"}`` — a loss that normalises its
    input itself (log-softmax, log-sigmoid) never receives the output of a softmax or
    sigmoid.  Broken by the double softmax (a model ending in softmax trained with
    ``CrossEntropyLoss``), a sigmoid before ``BCEWithLogitsLoss``, probabilities where
    ``NLLLoss`` expects log-probabilities: the loss stays bounded away from zero and its
    gradients shrink, and nothing fails.
``form = "same_shape"``  ``{"form": "same_shape", "api": "torch.nn.functional.mse_loss",
    "arg": "input", "other": "target"}`` — an elementwise loss compares tensors of one
    shape.  Broken by ``(N, 1)`` predictions against ``(N,)`` targets: the pair broadcasts
    to ``(N, N)`` and every prediction is pulled towards the mean target (torch only warns).

Which arguments are hypotheses is fixed by each loss's documented contract, not by
what reference programs happen to do: the *target* of ``cross_entropy`` may well be
probabilities (soft labels, distillation), and ``mse_loss`` or ``binary_cross_entropy``
may take a sigmoid's output; those are never judged.  Whether a hypothesis ships is
still decided by inference and the shipping rules (support from several pipelines).
The rules bind in every stage, precision and grad mode, so sites keep no context.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..window import FactPlan
from .base import Lazy, Mode, Site, Template
from .view import WindowView

_F = "torch.nn.functional."
#: losses that normalise their input themselves -> the argument that must be raw scores
NORMALISING_INPUTS: dict[str, str] = {
    _F + "cross_entropy": "input",
    _F + "nll_loss": "input",  # log-probabilities: a log_softmax's output is not marked
    _F + "binary_cross_entropy_with_logits": "input",
    _F + "multilabel_soft_margin_loss": "input",
    _F + "kl_div": "input",
    _F + "ctc_loss": "log_probs",
}
#: elementwise losses -> the two arguments torch compares element by element
ELEMENTWISE_PAIRS: dict[str, tuple[str, str]] = {
    _F + name: ("input", "target") for name in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
}
FORMS = ("not_probabilities", "same_shape")


def _tensor(summary: Any) -> dict[str, Any] | None:
    return summary if isinstance(summary, dict) and summary.get("T") == "tensor" else None


class LossArguments(Template):
    relation = "LossArguments"

    def allows_precondition(self, family: tuple) -> bool:
        return False

    def check_plan(self, families: Any) -> frozenset[str]:
        """The APIs the deployed families are about."""
        return frozenset(family[1] for family in families)

    def sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        apis = mode.plan if mode.checking else NORMALISING_INPUTS.keys() | ELEMENTWISE_PAIRS.keys()
        for rank in view.ranks():
            by_api = view.calls_by_api(rank)
            for api in sorted(apis):
                for call in by_api.get(api, ()):
                    args = call.get("args")
                    if args:
                        yield from self._call_sites(view, call, args, rank, mode)

    def _call_sites(self, view: WindowView, call: dict[str, Any], args: dict[str, Any], rank: int,
                    mode: Mode) -> Iterator[Site]:
        api, stage, checking = call["api"], call.get("stage", ""), mode.checking
        records = Lazy(lambda: view.context_free_records(rank))
        name = NORMALISING_INPUTS.get(api)
        argument = _tensor(args.get(name)) if name is not None else None
        if argument is not None:
            family = ("not_probabilities", api, name)
            holds = not argument.get("probs")
            if mode.wants(family) and not (holds and checking):
                yield Site(family, holds, records, [rank], stage,
                           {} if holds else {"call": call["key"], "arg": name, "given": "probabilities"})
        pair = ELEMENTWISE_PAIRS.get(api)
        if pair is not None:
            first, second = _tensor(args.get(pair[0])), _tensor(args.get(pair[1]))
            if first is None or second is None or not isinstance(first.get("shape"), list):
                return
            family = ("same_shape", api, *pair)
            holds = first["shape"] == second.get("shape")
            if mode.wants(family) and not (holds and checking):
                yield Site(family, holds, records, [rank], stage,
                           {} if holds else {"call": call["key"], pair[0]: first["shape"], pair[1]: second.get("shape")})

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        params = {"form": family[0], "api": family[1], "arg": family[2]}
        if family[0] == "same_shape":
            params["other"] = family[3]
        return params

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        form, api, arg = params["form"], params["api"], params["arg"]
        if form not in FORMS:
            raise ValueError("form")
        if not isinstance(api, str) or not isinstance(arg, str):
            raise TypeError("api" if not isinstance(api, str) else "arg")
        if form == "same_shape":
            other = params["other"]
            if not isinstance(other, str):
                raise TypeError("other")
            return (form, api, arg, other), None
        return (form, api, arg), None

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        names = {params["arg"], params["other"]} if params["form"] == "same_shape" else {params["arg"]}
        return FactPlan(apis={params["api"]}, args={params["api"]: names}, state_points=set(), state_attrs=set())

    def describe(self, params: Mapping[str, Any]) -> str:
        if params["form"] == "same_shape":
            return (f"arguments {params['arg']!r} and {params['other']!r} of {params['api']} have the same shape "
                    "(no broadcasting)")
        return f"argument {params['arg']!r} of {params['api']} is never the output of a softmax or sigmoid"

    def hint(self, params: Mapping[str, Any]) -> str:
        if params["form"] == "same_shape":
            return ("prediction and target broadcast against each other (e.g. (N, 1) vs (N,) becomes (N, N)): every "
                    "prediction is compared with every target; squeeze or reshape one of them")
        return ("the loss normalises its input itself: a softmax or sigmoid in front of it (often at the end of the "
                "model) squashes the gradients; pass the raw scores (logits), or log_softmax for NLLLoss")
