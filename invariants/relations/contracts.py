"""ApiContract: documented contracts of torch APIs, evaluated by the producer on each call.

``{"contract": "unscaled_grads", "api": "torch.nn.utils.clip_grad_norm_"}`` — some
contracts are about objects only the training process can see: whether the gradients
a clip receives are still multiplied by a ``GradScaler``'s loss scale, whether a
restored state dict holds anything the module does not hold already, whether a new
optimizer starts over the state of an identical one that was training the same
parameters.  The producer evaluates each on the call it is about and sends the answer
(``ctx.contract``, see `invariants.contract_apis.CONTRACTS`); this template turns the answers
into sites, so whether a contract ships is still decided by inference and the shipping
rules, like any other hypothesis.  The contracts bind in every stage, precision and
grad mode, so sites keep no context.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..contract_apis import CONTRACTS
from ..events import CLIP_GRAD_NORM, SCHEDULER_STEP
from ..window import FactPlan
from .base import Mode, Site, Template
from .view import WindowView

DESCRIPTIONS: dict[str, str] = {
    "unscaled_grads": "{api} is given unscaled gradients: GradScaler.unscale_ runs first in a step that scales the loss",
    "replaces_weights": "{api} restores at least one tensor the module does not already hold",
    "keeps_optimizer_state": ("{api} never starts over the state (moments, momentum) of an identical optimizer that "
                              "was training the same parameters"),
    "grads_reach_what_ran": ("{api} gives a gradient to most of the trainable parameters it holds whose layers ran "
                             "with gradients"),
    "reshuffles_each_epoch": ("a training pass of {api} over a shuffling DistributedSampler starts a new epoch "
                              "(set_epoch was called since the previous pass)"),
    "keeps_learning": ("{api} never runs twice in a row with every learning rate at zero once it has run with a "
                       "positive one"),
    "keeps_trained_weights": ("{api} never steps on with its state (moments, momentum) for trained weights that "
                              "load_state_dict has set back to their values before training"),
    "optimizes_unfrozen": ("{api} runs only where every parameter unfrozen since training began that takes a "
                           "gradient is held by an optimizer"),
    "frozen_norm_keeps_stats": ("a BatchNorm layer whose affine parameters are all frozen never runs {api} in "
                                "training mode with gradients enabled (it would still update its running statistics)"),
    "fresh_dataset_rng": ("a DataLoader worker of a training pass never starts ({api}) from the dataset-owned RNG "
                          "state that an earlier training pass's workers started from"),
    "keeps_weights_after_eval": ("{api} resumes after an evaluation from the weights it left at its previous step "
                                 "(whatever the evaluation swapped in was swapped back out)"),
    "averages_accumulated_losses": ("{api} never takes the sum of several micro-batch losses that nothing "
                                    "rescaled (accumulated gradients are averaged, not summed)"),
    "keeps_stored_samples": ("{api} never trains on batches whose fetch wrote into the sample tensors the dataset "
                             "stores, for samples already served before"),
    "fresh_autocast_weights": ("{api} never follows a training forward that autocast ran on low-precision casts "
                               "cached before an optimizer updated the weights in the same autocast region"),
    "keeps_frozen_weights": ("{api} never moves a parameter it trained that has been frozen since "
                             "(requires_grad=False)"),
    "freezes_through_parameters": ("{api} never updates parameters of a module whose requires_grad attribute "
                                   "was set to a value its parameters do not have (an attribute, not a freeze)"),
    "clips_whole_cycles": ("{api} never applies gradients that a clip_grad_norm_ rescaled before a later backward "
                           "of the same accumulation cycle added to them"),
    "carries_no_epoch_tail": ("{api} never applies gradients an earlier epoch's trailing micro-batches left "
                              "(a cycle crossing a training pass is no longer than one within a pass)"),
    "keeps_cycle_across_epoch": ("{api} never takes a cycle that a clear at an epoch's start cut short (a cycle "
                                 "after such a clear is as long as one within a pass)"),
    "steps_whole_cycles": ("{api} runs at most one accumulation cycle shorter than the fixed one an epoch began "
                           "with (the epoch's tail)"),
    "steps_own_grads": ("{api} never applies gradients that another optimizer's backward left in its parameters "
                        "together with those of a backward of its own"),
    "evaluates_fitted_norm": ("a BatchNorm layer with learned affine parameters never runs {api} in evaluation "
                              "mode on running statistics still at their initial values (mean 0, variance 1)"),
    "steps_schedule_with_optimizer": ("{api} never uses rates that a learning-rate schedule moved after being "
                                      "stepped more than once since the optimizer's previous step"),
    "rescales_groups_alike": ("{api} never follows learning rates written by hand that raised one parameter "
                              "group's rate while lowering another's"),
    "steps_clipped_grads": ("{api} applies gradients within the norm bound of a clip_grad_norm_ called after "
                            "the latest backward (the clip was given the parameters it bounds)"),
    "schedules_stepping_optimizer": ("{api} runs only where every optimizer a learning-rate schedule stepped "
                                     "since the previous optimizer step is one that training still steps"),
    "updates_move_average": ("{api} follows only averaging writes that moved a half-precision weight average "
                             "(a deep copy of trained weights no optimizer holds) where it differs from the weights"),
    "averages_once_per_step": ("{api} follows a weight average (a deep copy of trained weights no optimizer holds) "
                               "written at most once between two backwards with no optimizer step in between"),
    "resumes_trained_parameters": ("{api} of an optimizer resumed from a checkpoint steps only parameters the "
                                   "checkpoint holds optimizer state for, or ones unfrozen since the resume"),
    "resumes_loaded_weights": ("{api} of an optimizer resumed from a checkpoint never steps parameters "
                               "re-initialised since the checkpoint's weights were loaded into them"),
    "anneals_within_horizon": ("{api} never uses a rate from a schedule stepped past its horizon (a "
                               "CosineAnnealingLR's T_max, a transformers schedule's num_training_steps)"),
    "steps_each_memory_once": ("{api} never holds two parameters that are one memory (each tensor is stepped "
                               "once per step)"),
    "clears_between_evaluations": ("{api} inside a later evaluation of an optimizer step's closure (LBFGS) "
                                   "starts from gradients cleared since that evaluation began"),
    "replays_checkpoint_rng": ("{api} never follows an activation-checkpointed block that drew random numbers "
                               "(dropout) without preserving its RNG state for the recompute"),
    "resumes_schedule": ("{api} never starts a schedule over from epoch 0 for an optimizer resumed from a "
                         "checkpoint"),
    "steps_once_per_epoch": ("{api} of a StepLR/MultiStepLR counts epochs: stepped per iteration it never lowers "
                             "the rate within an epoch it already lowered it in (or began in), and once stepped "
                             "every few iterations it is not then stepped after a single one"),
    "compares_like_shapes": ("{api} of a loss whose arithmetic never subtracts a (B,) target from a (B, 1) model "
                             "output (a broadcast to a (B, B) matrix)"),
    "clears_used_grads": ("{api} never clears gradients that a backward produced since the last optimizer step "
                          "before an optimizer used them"),
    "module_clears_used_grads": ("{api} never clears an optimizer's gradients that a backward produced since the "
                                 "last optimizer step before an optimizer used them"),
}
#: contracts the producer judges from calls of further APIs, which must be recorded too
READS_ALSO: dict[str, set[str]] = {"steps_schedule_with_optimizer": {SCHEDULER_STEP},
                                   "rescales_groups_alike": {SCHEDULER_STEP},
                                   "steps_clipped_grads": {CLIP_GRAD_NORM},
                                   "schedules_stepping_optimizer": {SCHEDULER_STEP},
                                   "anneals_within_horizon": {SCHEDULER_STEP}}
WIPED_ACCUMULATION = ("the gradients of a backward were cleared before any optimizer step used them: with gradient "
                      "accumulation only the last micro-batch reaches the update; clear once per optimizer step, "
                      "after it (inside accelerate's accumulate(), call the prepared optimizer's zero_grad, which "
                      "skips accumulating micro-steps, not model.zero_grad())")
HINTS: dict[str, str] = {
    "unscaled_grads": ("the gradients are still multiplied by the loss scale (65536 to start with): the clip sees a "
                       "norm thousands of times too large and shrinks every update; call scaler.unscale_(optimizer) "
                       "before clip_grad_norm_"),
    "replaces_weights": ("nothing was restored: the checkpoint's keys match none of the module's (a 'module.' prefix "
                         "from DataParallel/DDP loaded with strict=False), or the dict holds the module's own tensors "
                         "(merged into model.state_dict(), or a 'best' state kept without copying)"),
    "keeps_optimizer_state": ("the optimizer was built again over parameters it was already training (inside the "
                              "loop?): Adam's moments and step count, or momentum, start from zero; build it once, or "
                              "load the old optimizer's state_dict"),
    "grads_reach_what_ran": ("layers ran with gradients enabled, yet no gradient reached them: a .detach() (or a "
                             "round trip through .item()/numpy) cuts them off the loss, so they never train; freeze on "
                             "purpose with requires_grad_(False) or torch.no_grad()"),
    "reshuffles_each_epoch": ("DistributedSampler shuffles with seed + epoch, and its epoch changes only through "
                              "sampler.set_epoch(epoch): without it every epoch replays the same order and batches; "
                              "call set_epoch at the start of each epoch"),
    "keeps_learning": ("every learning rate is 0 again after training began, so each step changes nothing: a "
                       "schedule sized for fewer steps than the run (num_training_steps computed for one epoch, a "
                       "LambdaLR clamped at 0), or a rate overwritten with 0"),
    "keeps_trained_weights": ("load_state_dict put trained weights back to where training started (a pretrained or "
                              "initial checkpoint loaded inside the training loop, a reset meant for a new fold) and "
                              "training went on with the old optimizer state: load it once before training; to start "
                              "over on purpose, build a new optimizer or load its state_dict too"),
    "optimizes_unfrozen": ("parameters were unfrozen (requires_grad=True) after the optimizers were built and now take "
                           "gradients, but no optimizer holds them, so they never change: an optimizer built over the "
                           "trainable parameters only (Hugging Face Trainer, a requires_grad filter) does not see later "
                           "unfreezing; add them with optimizer.add_param_group (Lightning: "
                           "BaseFinetuning.unfreeze_and_add_param_group) or build the optimizer again"),
    "frozen_norm_keeps_stats": ("requires_grad_(False) froze this BatchNorm's weight and bias but not its running "
                                "mean and variance: in training mode every forward moves them towards the current "
                                "batches, so the frozen backbone's features drift; put the frozen part in eval() "
                                "after every model.train() (Lightning: also after validation)"),
    "fresh_dataset_rng": ("the dataset keeps its own RNG (a RandomState/Generator attribute) and only its copies in "
                          "the workers advance: workers started again each epoch begin from the same state, so every "
                          "epoch replays the same random crops, flips and noise; reseed it in a worker_init_fn from "
                          "torch.initial_seed() (or get_worker_info().seed), or use persistent_workers=True"),
    "keeps_weights_after_eval": ("the weights changed between the last step before an evaluation and the first "
                                 "one after it, though they stay put between steps otherwise: weights swapped in for "
                                 "the evaluation (EMA/averaged weights copied with copy_to or p.copy_) were never "
                                 "swapped back, so training goes on from them with moments computed for others; "
                                 "store() before and restore() after evaluating, or evaluate a copy of the model"),
    "averages_accumulated_losses": ("this step accumulated the gradients of several micro-batches whose losses "
                                    "were not divided by their number: the update follows their sum, k times the "
                                    "mean gradient, as if the learning rate were k times larger; back-propagate "
                                    "loss / accumulation_steps (or normalise by the step's total token count)"),
    "keeps_stored_samples": ("fetching this step's batch wrote into the tensors the dataset keeps its samples in, "
                             "for samples it had served before: __getitem__ edits a view of its storage in place "
                             "(MLM masking, noise or normalisation without clone()), so every epoch after the first "
                             "trains on samples already masked or augmented; clone() the sample before editing it"),
    "fresh_autocast_weights": ("an optimizer stepped inside the autocast region this forward ran in: autocast keeps "
                               "its low-precision casts of the weights until the outermost region exits, so the "
                               "forward computed with the weights as they were at the region's first forward and "
                               "training stalls; wrap only the forward and loss in torch.autocast (step the "
                               "optimizer outside it), or pass cache_enabled=False"),
    "keeps_frozen_weights": ("a parameter this optimizer trained was frozen (requires_grad=False, or a gradient "
                             "hook returning zeros), but it still has a gradient (a zero one kept by "
                             "zero_grad(set_to_none=False) or made by the hook, or a freeze between backward and "
                             "step), so the step moves it: weight decay shrinks it and the momentum left from "
                             "training keeps pushing it; clear with set_to_none=True (the default), set the frozen "
                             "parameters' grad to None, or build the optimizer over the trainable part"),
    "freezes_through_parameters": ("a module's requires_grad was assigned (module.requires_grad = False): on an "
                                   "nn.Module that only sets a Python attribute, so its parameters still take "
                                   "gradients and this step updates them while the code reads as a freeze; call "
                                   "module.requires_grad_(False), or set requires_grad on each parameter"),
    "clips_whole_cycles": ("clip_grad_norm_ ran on a partial sum of an accumulation cycle and rescaled it, and later "
                           "micro-batches were added at full weight: the update is neither bounded nor the average "
                           "of the cycle; clip once per optimizer step, after the cycle's last backward (under "
                           "accelerate: inside `if accelerator.sync_gradients:`)"),
    "carries_no_epoch_tail": ("this step applies more micro-batches than any step within one epoch did: the "
                              "backwards of the previous epoch's last micro-batches were never stepped nor cleared "
                              "(the accumulation trigger counts batches per epoch and the epoch's length is not a "
                              "multiple of it), so their gradients, computed with last epoch's weights, leak into "
                              "this step; step (or clear) on the last batch of each epoch"),
    "keeps_cycle_across_epoch": ("a clear at the start of this epoch discarded the micro-batches the previous "
                                 "epoch had accumulated toward this step, and the step fires on a count kept over "
                                 "the whole run, so it applies fewer micro-batches than a whole cycle; clear only "
                                 "after optimizer steps, or count micro-batches per epoch"),
    "steps_whole_cycles": ("this epoch accumulated a fixed number of backwards per step, and now steps on fewer "
                           "for the second time: the step condition fires on every micro-batch here (accelerate "
                           "syncing with the dataloader on its last batch, split into micro-batches inside "
                           "accelerator.accumulate), so each update sees a fraction of the intended batch and a "
                           "schedule counted in planned steps runs out early; step once per k micro-batches "
                           "(GradientAccumulationPlugin(sync_with_dataloader=False) for batches split by hand)"),
    "steps_own_grads": ("a backward that another optimizer stepped on (a generator's loss through the "
                        "discriminator, an actor's loss through the critic) also wrote into this optimizer's "
                        "gradients, and nothing cleared them before this optimizer's own backward: the step "
                        "applies both losses' gradients; call this optimizer's zero_grad() right before its own "
                        "backward, or switch its parameters' requires_grad off for the other loss"),
    "evaluates_fitted_norm": ("this BatchNorm layer holds learned scale and shift but its running mean and variance "
                              "were never fitted: weights were copied or averaged parameter by parameter (an EMA or "
                              "mean teacher over model.parameters(), an AveragedModel without update_bn, a checkpoint "
                              "of named_parameters()) and the buffers were left behind; copy or average the buffers "
                              "too (model.buffers(), use_buffers=True, load the full state_dict) or run "
                              "torch.optim.swa_utils.update_bn before evaluating"),
    "anneals_within_horizon": ("a schedule was stepped past its horizon (CosineAnnealingLR's T_max, a transformers "
                               "schedule's num_training_steps): past it a cosine climbs back to the base rate and "
                               "training runs through restarts nobody asked for (the others sit at zero); "
                               "the horizon was counted in epochs for a schedule stepped per batch (or in optimizer "
                               "steps for one stepped per micro-batch): set T_max to the number of scheduler steps "
                               "(epochs * batches per epoch / accumulation), or step it once per epoch"),
    "clears_between_evaluations": ("the closure given to the optimizer's step does not clear the gradients before "
                                   "its backward, and the optimizer (LBFGS) evaluates it several times per step: "
                                   "the line search reads gradients summed over every evaluation so far; call "
                                   "optimizer.zero_grad() inside the closure, before loss.backward()"),
    "replays_checkpoint_rng": ("a checkpointed block drew random numbers (dropout) with preserve_rng_state=False, so "
                               "the backward recomputed its activations with other masks and the gradients belong to "
                               "another network than the loss: keep the default preserve_rng_state=True wherever a "
                               "checkpointed block has dropout or other randomness"),
    "steps_each_memory_once": ("two parameters the optimizer holds are one memory, so every step updates it twice, "
                               "each time with its own moments: a checkpoint of tied weights loaded with "
                               "load_state_dict(assign=True) wraps the shared tensor in a new Parameter per key; "
                               "re-tie the weights after loading (model.tie_weights(), or assign one parameter to "
                               "the other) before building the optimizer"),
    "steps_schedule_with_optimizer": ("the learning-rate schedule was stepped several times between two steps of "
                                      "its optimizer and has moved the rate: it runs that many times too fast (a "
                                      "schedule stepped on every micro-batch of gradient accumulation, or in the "
                                      "batch loop and again at the epoch's end); step it once per optimizer step "
                                      "(inside the 'if (i + 1) % k == 0' block, or pass it to accelerator.prepare, "
                                      "which skips accumulating micro-steps)"),
    "rescales_groups_alike": ("a hand-written learning-rate change raised one parameter group's rate while it "
                              "lowered another's: one rate was written into every group, and the ratio the groups "
                              "were built with (a backbone at a tenth of the head's rate, no decay on some "
                              "parameters) is gone; scale each group from its own base rate "
                              "(group['lr'] = group['initial_lr'] * factor) or use a torch scheduler"),
    "steps_clipped_grads": ("clip_grad_norm_ ran after the latest backward, yet the gradients this step applies "
                            "exceed its max_norm: the clip was handed an iterator already used up (model.parameters() "
                            "or a filter() consumed by the optimizer's constructor clips nothing), or the gradients "
                            "changed after it; pass a list (params = [p for p in model.parameters() if "
                            "p.requires_grad]) to both, and clip right before the step"),
    "updates_move_average": ("the weight average (EMA) is kept in bf16 or fp16, where (1 - decay) * (average - "
                             "weights) is below the precision of its values: the updates round to nothing and the "
                             "average stays where it was made; keep the average in float32 whatever the model's "
                             "dtype"),
    "averages_once_per_step": ("the weight average (EMA) was updated again with no optimizer step since the previous "
                               "backward: updated per micro-batch of gradient accumulation, it averages several times "
                               "per step over unchanged weights and its decay runs that many times too fast; update it "
                               "only after the optimizer stepped (inside accelerate's accumulate(): when "
                               "accelerator.sync_gradients)"),
    "resumes_trained_parameters": ("the first step after the resume updates parameters that were never trained "
                                   "before the checkpoint (no optimizer state) and that were already trainable when "
                                   "the state was loaded: a freeze the first run applied after building the model "
                                   "(freeze_feature_encoder(), requires_grad_(False)) was lost, since requires_grad "
                                   "is not part of a state_dict; apply the freeze again after rebuilding the model "
                                   "on resume"),
    "resumes_loaded_weights": ("the weights loaded from the checkpoint were re-initialised before training resumed "
                               "(an init or reset_parameters() run after load_state_dict, or a data-dependent "
                               "initialisation in the first training forward whose 'initialised' flag is an "
                               "attribute the state dict does not hold), while the optimizer's state, step count "
                               "and schedule were restored: training goes on from fresh weights with moments built "
                               "for others; initialise before loading, skip initialisation when restarting from a "
                               "checkpoint, or register the flag as a buffer"),
    "schedules_stepping_optimizer": ("a learning-rate schedule was stepped over an optimizer that training no longer "
                                     "steps: its rates decay on paper (get_last_lr) while the optimizer that steps "
                                     "keeps its own; a scheduler restored from a checkpoint may hold a pickled copy "
                                     "of the optimizer (re-attach it: sched.after_scheduler.optimizer = optimizer), "
                                     "or the optimizer was rebuilt without rebuilding its scheduler"),
    "resumes_schedule": ("the optimizer was resumed from a checkpoint (its state was loaded) but this scheduler "
                         "starts from epoch 0: its state was not saved or not loaded (accelerate saves only prepared or "
                         "registered schedulers), so the warm-up replays and the decay is shifted by the resumed steps; "
                         "save and load scheduler.state_dict() with the optimizer's, or build it with last_epoch"),
    "steps_once_per_epoch": ("an epoch schedule is being stepped in the batch loop: its step_size/milestones count "
                             "epochs, so the rate drops by gamma every few batches and is near zero long before the "
                             "schedule meant it to be; call scheduler.step() once per epoch, after the batch loop "
                             "(or give step_size/milestones in optimizer steps if per-step decay is intended)"),
    "compares_like_shapes": ("the loss subtracts a (B,)-shaped target from a (B, 1) prediction: the difference "
                             "broadcasts to (B, B), so every prediction is compared with every target and is pulled "
                             "towards the batch's mean target; squeeze the prediction (pred.squeeze(-1)) or "
                             "unsqueeze the target so both have one shape"),
    "clears_used_grads": WIPED_ACCUMULATION,
    "module_clears_used_grads": WIPED_ACCUMULATION,
}


class ApiContract(Template):
    relation = "ApiContract"

    def allows_precondition(self, family: tuple) -> bool:
        return False

    def check_plan(self, families: Any) -> frozenset[str]:
        """The APIs the deployed contracts are about."""
        return frozenset(family[1] for family in families)

    def sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        apis = mode.plan if mode.checking else frozenset(CONTRACTS.values())
        checking = mode.checking
        for rank in view.ranks():
            by_api = view.calls_by_api(rank)
            for api in sorted(apis):
                for call in by_api.get(api, ()):
                    ctx = call.get("ctx")
                    contract = ctx.get("contract") if isinstance(ctx, dict) else None
                    if not isinstance(contract, dict):
                        continue
                    for name, kept in contract.items():
                        if CONTRACTS.get(name) != api or kept.__class__ is not bool:
                            continue
                        family = (name, api)
                        if (kept and checking) or not mode.wants(family):
                            continue
                        yield Site(family, kept, lambda rank=rank: view.context_free_records(rank), [rank],
                                   call.get("stage", ""), {} if kept else {"call": call["key"], "contract": name})

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        return {"contract": family[0], "api": family[1]}

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        contract, api = params["contract"], params["api"]
        if not isinstance(contract, str) or contract not in CONTRACTS:
            raise ValueError("contract")
        if api != CONTRACTS[contract]:
            raise ValueError("api")
        return (contract, api), None

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        apis = {params["api"]} | READS_ALSO.get(params["contract"], set())
        return FactPlan(apis=apis, args={}, state_points=set(), state_attrs=set())

    def describe(self, params: Mapping[str, Any]) -> str:
        return DESCRIPTIONS[params["contract"]].format(api=params["api"])

    def hint(self, params: Mapping[str, Any]) -> str:
        return HINTS[params["contract"]]
