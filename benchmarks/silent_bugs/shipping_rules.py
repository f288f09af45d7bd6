"""What an inferred invariant needs before it may ship in the default set, and why one
was refused.

The default set is applied, without configuration, to programs its references never
saw; an invariant that describes one program's habits becomes a false alarm there.  So
a candidate ships only with evidence that it is a law of training code, not a habit:

* **pipelines**: inferring each reference pipeline *alone* finds it (same relation and
  parameters) in at least ``MIN_PIPELINES`` pipelines, of at least ``MIN_STYLES``
  different styles (`STYLES`: three copies of one loop are one piece of evidence);
* **examples**: at least ``MIN_POSITIVES`` positive examples over all references
  (``MIN_POSITIVES_WORKER_STARTS`` for rules about DataLoader workers starting, which
  happens once an epoch, and ``MIN_POSITIVES_FIRST_FORWARDS`` for rules about a module's
  first forward, once per module);
* **constants** (an output dtype, an argument value of an inner call): every pipeline
  whose own inference pins the same thing under the same precondition pins the same
  value; output dtypes only under an active autocast; argument values only for the
  ``training`` flag (``p = 0.5``, ``inplace = False`` are configuration);
* **setup is free**: no "X is never called during setup", no initialiser argument
  agreeing across ranks call by call (rank 0 alone may build a checkpoint), and no
  "a model is never built or rewritten after an evaluation" (a staged program builds its
  next model there, and evaluations swap weights in);
* **harmless calls are no law**: no "gradients are never cleared in stage S", no "a
  loss is never computed in stage S" (a validation loss is good practice), nothing
  about when a state dict is restored or an epoch starts but their contracts
  (``MIN_POSITIVES_RARE_CALLS`` examples are enough there: a run restores and starts
  epochs a few times, not every step; the same holds for the contracts judged once an
  epoch, ``PER_EPOCH_CONTRACTS``, and once a resume, ``PER_RESUME_CONTRACTS``), no "a
  module's forward comes before the loss"
  (models written with raw tensors have none);
* **data is not a law**: a module's or a loss's input agreeing across data-parallel
  ranks is refused (each rank pads its own batch), and so is a loss's output dtype
  tied to one of its arguments (float64 targets from numpy make a float64 loss);
* **validation**: it stays silent on a validation run of every reference and on the
  core's synthetic healthy runs (checked by the build script).

The core refuses, at inference, what no amount of evidence makes a law (user class names as
keys, distinct-value rules about non-RNG values, hyperparameter values as argument pins:
see ``invariants/relations/identity.py`` and the templates); an audited file that
predates those refusals gets them as reasons too (`core_refusals`).  Every rule here returns
the reasons a candidate fails, so a build can say why each refused invariant was refused.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from invariants.events import DATALOADER_EPOCH, MODULE_LOAD_STATE_DICT
from invariants.relations import TEMPLATES
from invariants.relations.identity import keyed_on_user_class
from producers.selection import DROPOUT_FUNCTIONS, LOSS_FUNCTIONS

MIN_PIPELINES = 3
MIN_STYLES = 3
MIN_POSITIVES = 30
#: Rules about DataLoader workers starting have one example per epoch (workers start
#: once an epoch, or once a run when persistent): thirty would take thirty epochs of
#: every reference.  Their evidence is the number of pipelines and styles, which stays.
MIN_POSITIVES_WORKER_STARTS = 6
WORKER_INIT = "torch.utils.data.worker_init"
#: A module's first forward happens once per module and process: the same holds for
#: rules about first forwards.
MIN_POSITIVES_FIRST_FORWARDS = 6
#: A program restores a state dict a few times a run (a resume, an EMA swap, the best
#: weights before a test) and starts an epoch a few times a run, not every step: the
#: contracts on restores and epochs count them.
MIN_POSITIVES_RARE_CALLS = 6
#: Contracts judged once an epoch, whatever API they sit on: an epoch schedule's step
#: (``StepLR``/``MultiStepLR`` step after each epoch) and a training pass's worker start
#: (workers start afresh each epoch).  A 6-step reference run holds one to three epochs,
#: so they count epochs like the restores and epoch starts above; the pipelines, styles
#: and validation runs they need stay.
PER_EPOCH_CONTRACTS = frozenset({"steps_once_per_epoch", "fresh_dataset_rng"})
#: Contracts judged once per resume from a checkpoint (an optimizer's first step after
#: ``Optimizer.load_state_dict``): the references resume twice a run at most.
PER_RESUME_CONTRACTS = frozenset({"resumes_loaded_weights", "resumes_trained_parameters"})
#: APIs recorded for their contract alone: when and after what a program restores a
#: state dict or starts an epoch is its own choice, so no other rule may name them
CONTRACT_ONLY_APIS = frozenset({MODULE_LOAD_STATE_DICT, DATALOADER_EPOCH})

#: reference id -> style: how its training loop is written (model family, launch, data
#: path).  Pipelines of one style share habits; support must span several styles.  A
#: reference not listed is its own style (and `Reference.style`, when set, wins).
STYLES: dict[str, str] = {
    "mlp_regression_sgd": "mlp", "mlp": "mlp",
    "gpt_tied_lm": "transformer-lm", "tiny_transformer_lm": "transformer-lm",
    "lstm_classifier": "rnn",
    "conv_autoencoder": "cnn", "cnn_bn_dropout": "cnn", "resnet_cosine": "cnn",
    "gan_two_optimizers": "gan", "sngan_hinge": "gan",
    "bf16_autocast": "mixed-precision", "bf16_autocast_encoder": "mixed-precision",
    "bf16_weights_finetune": "low-precision-weights",
    "grad_accumulation": "grad-accumulation",
    "finetune_frozen_backbone": "finetune",
    "dataloader_augment": "dataloader-workers", "speech_augment_owned_rng": "dataloader-workers",
    "ddp_torchrun": "ddp-torchrun", "ddp_gloo": "ddp-torchrun",
    "spawn_ddp": "ddp-spawn",
    "manual_allreduce_dp": "manual-data-parallel",
}


def style_of(reference: Any) -> str:
    """The style of a reference (a `Reference` or its id)."""
    explicit = getattr(reference, "style", None)
    if explicit:
        return str(explicit)
    ref_id = getattr(reference, "id", reference)
    return STYLES.get(ref_id, ref_id)


def shape(invariant: Mapping[str, Any]) -> str:
    """What an invariant says, regardless of the precondition inferred for it."""
    return json.dumps([invariant["relation"], invariant["params"]], sort_keys=True)


def positives(invariant: Mapping[str, Any]) -> int:
    examples = invariant.get("examples") or {}
    return int(examples.get("positive", invariant.get("positive", 0)) or 0)


def min_positives(invariant: Mapping[str, Any]) -> int:
    if invariant["relation"] == "APIArg" and invariant["params"].get("api") == WORKER_INIT:
        return MIN_POSITIVES_WORKER_STARTS
    if invariant["params"].get("first_forward") is True:
        return MIN_POSITIVES_FIRST_FORWARDS
    if invariant["relation"] == "ApiContract" and (invariant["params"].get("api") in CONTRACT_ONLY_APIS
                                                   or invariant["params"].get("contract")
                                                   in PER_EPOCH_CONTRACTS | PER_RESUME_CONTRACTS):
        return MIN_POSITIVES_RARE_CALLS
    if is_rank_agreement(invariant) and invariant["params"].get("api") in CONTRACT_ONLY_APIS:
        return MIN_POSITIVES_RARE_CALLS
    return MIN_POSITIVES


# ----------------------------------------------------------------------------- constants
def _requires_active_autocast(precondition: Mapping[str, Any] | None) -> bool:
    """True when every disjunct of a (non-negated) precondition pins ``ctx.autocast`` to a dtype."""
    if not precondition or precondition.get("negated"):
        return False
    return all(
        any(clause.get("field") == "ctx.autocast" and clause.get("kind") == "constant"
            and None not in clause.get("values", [None]) for clause in conjunct.get("all", []))
        for conjunct in precondition.get("any", [])
    )


def is_dtype_artefact(invariant: Mapping[str, Any]) -> bool:
    """An output dtype pinned without an active autocast: the references' default
    precision, not a law (a user's fp16/bf16/fp64 model differs)."""
    params = invariant["params"]
    return (invariant["relation"] == "APIOutput" and params.get("form") == "constant"
            and params.get("prop") == "dtype" and not _requires_active_autocast(invariant.get("precondition")))


def is_configuration_pin(invariant: Mapping[str, Any]) -> bool:
    """"Module M calls F with argument a = v" for anything but the training flag."""
    params = invariant["params"]
    return (invariant["relation"] == "EventContain" and params.get("form") == "call"
            and bool(set(params.get("args") or {}) - {"training"}))


def is_evaluation_seeding(invariant: Mapping[str, Any]) -> bool:
    """"Seeding never happens in stage S" for a stage other than training: re-seeding
    before an evaluation is a reproducibility practice (a ``test()`` that calls
    ``torch.manual_seed`` first), and an evaluation's RNG never reaches the weights."""
    params = invariant["params"]
    return (invariant["relation"] == "APIAbsent" and "seed" in str(params.get("api", ""))
            and params.get("stage") != "train")


def is_collective_habit(invariant: Mapping[str, Any]) -> bool:
    """"Collective C is never called while training": which collectives a training loop
    runs is its framework's choice (trainers broadcast early-stopping decisions and
    checkpoint paths mid-run), not a property of correct training."""
    params = invariant["params"]
    api = str(params.get("api", ""))
    return (invariant["relation"] == "APIAbsent" and api.startswith("torch.distributed.")
            and api != "torch.distributed.init_process_group" and params.get("stage") == "train")


CLEARING_APIS = frozenset({"torch.optim.Optimizer.zero_grad", "torch.nn.Module.zero_grad"})
#: calls whose arguments are a batch of data (each data-parallel rank has its own)
DATA_APIS = frozenset({"torch.nn.Module.forward", *LOSS_FUNCTIONS})
INIT_PREFIX = "torch.nn.init."


def is_harmless_absence(invariant: Mapping[str, Any]) -> bool:
    """"Gradients are never cleared in stage S": clearing is harmless anywhere, and a loop
    that clears at the top of each iteration does so right after the previous
    iteration's evaluation, before ``model.train()``.  Likewise "a loss is never computed
    in stage S": a validation loss is good practice, and its absence a habit."""
    params = invariant["params"]
    return invariant["relation"] == "APIAbsent" and params.get("api") in CLEARING_APIS | set(LOSS_FUNCTIONS)


def is_contract_only_habit(invariant: Mapping[str, Any]) -> bool:
    """Any rule but the contract, or an argument agreeing across ranks, about an API
    recorded for its contract alone: whether, where and after what a program restores a
    state dict (a resume mid-run, an EMA swap before evaluation, the best weights before
    a test) or starts an epoch is its own choice.  The arguments such an API records are
    recorded for a law about ranks (a shuffling ``DistributedSampler``'s seed, which
    PyTorch requires to be identical across processes)."""
    params = invariant["params"]
    named = {params.get(key) for key in ("api", "first", "then", "child")}
    if is_rank_agreement(invariant):
        return False
    return invariant["relation"] != "ApiContract" and bool(CONTRACT_ONLY_APIS & named)


def is_rank_agreement(invariant: Mapping[str, Any]) -> bool:
    return invariant["relation"] == "APIArg" and invariant["params"].get("form") == "ranks"


def is_module_before_loss(invariant: Mapping[str, Any]) -> bool:
    """"A module's forward comes before every loss": a model written with raw tensors and
    no ``nn.Module`` (makemore, "What is torch.nn really?") computes its loss all the same."""
    params = invariant["params"]
    return (invariant["relation"] == "APISequence" and params.get("first") == "torch.nn.Module.forward"
            and params.get("then") in LOSS_FUNCTIONS)


def is_setup_call_agreement(invariant: Mapping[str, Any]) -> bool:
    """"An initialiser's argument is the same on every rank for the same call": calls are
    matched by position, and setup is where one rank may do work the others do not (rank
    0 alone building and saving the checkpoint the others load)."""
    params = invariant["params"]
    return (invariant["relation"] == "APIArg" and params.get("form") == "ranks"
            and str(params.get("api", "")).startswith(INIT_PREFIX))


#: calls that build or rewrite a model: what a program does between an evaluation and the
#: next training forward
CONSTRUCTION_APIS = frozenset({"torch.distributed.init_process_group", "torch.Tensor.param_overwrite"})


def is_construction_after_eval(invariant: Mapping[str, Any]) -> bool:
    """"An initialiser (a process group, a write of a parameter's data) is never called in
    stage 'eval'": the stage stays 'eval' from an evaluation to the next training forward,
    and that is where a staged program builds its next model or head, and where weights
    are swapped for the evaluation (``p.data = ema``); re-initialising what training
    learned is judged in stage 'train', on the initialiser's target."""
    params = invariant["params"]
    api = str(params.get("api", ""))
    return (invariant["relation"] == "APIAbsent" and params.get("stage") == "eval"
            and (api.startswith(INIT_PREFIX) or api in CONSTRUCTION_APIS))


def is_setup_habit(invariant: Mapping[str, Any]) -> bool:
    """"X is never called in stage 'init'": the setup window is where a program may do
    anything (a dry-run forward for shapes, a warm-up, a model summary); what the
    references happened not to do there is no law."""
    return invariant["relation"] == "APIAbsent" and invariant["params"].get("stage") == "init"


def is_data_agreement(invariant: Mapping[str, Any]) -> bool:
    """"A module's (or a loss's) input is the same on every rank": the input is data, and data-parallel
    ranks see different batches (dynamic padding to each batch's longest sequence, an
    uneven last batch), so its shape agreeing across ranks is the references' data, not a
    law of the program.  The same holds for the activation a dropout is given (its rate
    and training flag agreeing across ranks is configuration, and stays a rule)."""
    params = invariant["params"]
    return (invariant["relation"] == "APIArg" and params.get("form") == "ranks"
            and (params.get("api") in DATA_APIS
                 or (params.get("api") in DROPOUT_FUNCTIONS and params.get("arg") == "input")))


def is_loss_dtype_tie(invariant: Mapping[str, Any]) -> bool:
    """"A loss's output has the dtype of its input (or target)": a loss promotes both
    arguments, and float32 predictions against the float64 targets numpy gives are
    healthy and make a float64 loss; which dtypes the references happened to use is
    their data, not a law."""
    params = invariant["params"]
    return (invariant["relation"] == "APIOutput" and params.get("form") == "same_as_input"
            and params.get("prop") == "dtype" and params.get("api") in LOSS_FUNCTIONS)


def constant_family(invariant: Mapping[str, Any]) -> str | None:
    """For an invariant that pins a value, what it pins and under which precondition
    (the value left out); None for invariants that pin nothing."""
    params = dict(invariant["params"])
    if invariant["relation"] == "APIOutput" and params.get("form") == "constant":
        params.pop("value", None)
    elif invariant["relation"] == "EventContain" and params.get("form") == "call" and params.get("args"):
        params["args"] = sorted(params["args"])
    else:
        return None
    return json.dumps([invariant["relation"], params, invariant.get("precondition")], sort_keys=True)


def pinned_values(per_pipeline: Mapping[str, Iterable[Mapping[str, Any]]]) -> dict[str, dict[str, set[str]]]:
    """constant family -> value (as JSON) -> the pipelines whose own inference pins it."""
    found: dict[str, dict[str, set[str]]] = {}
    for ref_id, invariants in per_pipeline.items():
        for invariant in invariants:
            family = constant_family(invariant)
            if family is not None:
                value = json.dumps(invariant["params"].get("value", invariant["params"].get("args")), sort_keys=True)
                found.setdefault(family, {}).setdefault(value, set()).add(ref_id)
    return found


# ----------------------------------------------------------------------------- reasons
def core_refusals(invariant: Mapping[str, Any]) -> list[str]:
    """What today's inference would not learn at all, whatever the evidence (an audited
    file may predate the rule): keys on user classes, non-RNG distinct values,
    non-flag argument values."""
    params = invariant["params"]
    if keyed_on_user_class(params):
        return [f"keyed on a user class or container, not a torch layer: {params['mtype']}"]
    template = TEMPLATES.get(invariant["relation"])
    if template is not None and not template.keeps_hypothesis(params):
        return ["not a law the template learns (distinct values that are not RNG-like, or an argument pin)"]
    return []


def evidence_reasons(invariant: Mapping[str, Any], support: Mapping[str, set[str]],
                     pins: Mapping[str, Mapping[str, set[str]]], styles: Mapping[str, str] | None = None) -> list[str]:
    """Why an invariant may not ship on its evidence (empty: it may, if it survives
    validation).  ``support``: shape -> reference pipelines that find it alone;
    ``pins``: `pinned_values` of the per-pipeline sets."""
    reasons = core_refusals(invariant)
    pipelines = sorted(support.get(shape(invariant), ()))
    if len(pipelines) < MIN_PIPELINES:
        reasons.append(f"pipelines {len(pipelines)} < {MIN_PIPELINES}: {', '.join(pipelines) or 'none alone'}")
    found_styles = sorted({(styles or {}).get(ref) or style_of(ref) for ref in pipelines})
    if len(found_styles) < MIN_STYLES:
        reasons.append(f"styles {len(found_styles)} < {MIN_STYLES}: {', '.join(found_styles) or 'none'}")
    count, needed = positives(invariant), min_positives(invariant)
    if count < needed:
        reasons.append(f"positive examples {count} < {needed}")
    if is_dtype_artefact(invariant):
        reasons.append("output dtype pinned without an active autocast")
    if is_configuration_pin(invariant):
        reasons.append("argument value pinned: configuration, not behaviour")
    if is_evaluation_seeding(invariant):
        reasons.append("seeding outside training: reproducibility practice, not a bug")
    if is_collective_habit(invariant):
        reasons.append("a collective's absence from training: the framework's habit, not a law")
    if is_setup_habit(invariant):
        reasons.append("an API's absence from setup: setup may do anything")
    if is_construction_after_eval(invariant):
        reasons.append("building or rewriting a model never called after an evaluation: staged programs do")
    if is_harmless_absence(invariant):
        reasons.append("clearing gradients or computing a loss never called in a stage: harmless anywhere")
    if is_module_before_loss(invariant):
        reasons.append("a module forward before a loss: models of raw tensors compute losses too")
    if is_contract_only_habit(invariant):
        reasons.append("when or after what a state dict is restored or an epoch starts: the program's choice")
    if is_setup_call_agreement(invariant):
        reasons.append("an initialiser's argument agreeing across ranks by call position: setup may differ by rank")
    if is_loss_dtype_tie(invariant):
        reasons.append("a loss's output dtype tied to one argument: losses promote both arguments")
    if is_data_agreement(invariant):
        reasons.append("a module's or a loss's input agreeing across ranks: data-parallel ranks see different data")
    family = constant_family(invariant)
    if family is not None and len(pins.get(family, {})) > 1:
        values = ", ".join(f"{value} ({', '.join(sorted(refs))})" for value, refs in sorted(pins[family].items()))
        reasons.append(f"pipelines pin different values: {values}")
    return reasons
