"""What the producer keeps to judge the API contracts it evaluates on calls.

Each contract of `invariants.contract_apis.CONTRACTS` needs a little memory of the program's
live objects: which optimizers stepped with state, whether a loss scale is pending,
which modules ran with gradients since the last step, which sampler passes began,
which optimizers have learned and for how many steps their rates have been zero,
what each parameter held before its first update, which frozen parameters to watch,
which dataset RNG state the workers of the latest training pass started from, whether
the latest backward's gradients are still unused, the weights each optimizer left at
its latest step, the losses of each optimizer's accumulation cycle,
which optimizers were resumed from a checkpoint, the training epochs the program
showed and how often each epoch schedule was stepped, whether a dataset wrote into
the samples it stores, whether an optimizer stepped since autocast last dropped
its cached casts, which frozen parameters each optimizer had trained, and each optimizer's longest
accumulation cycle within one training pass, and which optimizers' gradients a backward
that fed another optimizer's step changed, and which BatchNorm layers' statistics were
seen fitted, and how often each schedule was stepped since its optimizer's latest step,
which deep copies of trained parameters the program averages into, and which loaded
parameters were re-initialised before a resumed optimizer stepped them, which cosine
schedules were stepped over each optimizer, whether an optimizer's parameters
share memory, which training batches a data-parallel replica drew since its latest step,
whether the checkpointed blocks that drew random numbers kept their RNG state, and
whether a step's closure cleared the gradients before each evaluation after the first,
and how many backwards had run at each optimizer's latest step.
They live together here so that the tracer holds one object for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from .amp_scaling import LossScaleTracker
from .autocast_cache import AutocastCache
from .averaged_copies import AveragedCopies
from .epoch_schedules import EpochSchedules
from .epoch_tails import EpochTails
from .fitted_norms import FittedNorms
from .eval_weights import EvalWeights
from .fed_steps import FedSteps
from .foreign_grads import ForeignGrads
from .frozen_updates import FrozenUpdates
from .graph_cuts import GraphCuts
from .learning_rates import LearningRates
from .loss_averaging import AccumulatedLosses
from .module_flags import ModuleFlags
from .partial_clips import PartialClips
from .optimizer_restarts import OptimizerRestarts
from .replayed_rngs import ReplayedRngs
from .resumed_freezes import ResumedFreezes
from .resumed_weights import ResumedWeights
from .replica_batches import ReplicaBatches
from .sampler_epochs import SamplerEpochs
from .checkpoint_rng import CheckpointRng
from .clip_bounds import ClipBounds
from .closure_clears import ClosureClears
from .schedule_horizons import ScheduleHorizons
from .short_cycles import ShortCycles
from .shared_memory import SharedMemory
from .schedule_cadence import ScheduleCadence
from .schedule_targets import ScheduleTargets
from .schedule_resumes import ScheduleResumes
from .stored_samples import StoredSamples
from .unfrozen_params import UnfrozenParams
from .unstepped_optimizers import UnsteppedOptimizers
from .wasted_grads import WastedGrads
from .weight_rewinds import WeightRewinds

if TYPE_CHECKING:
    from .ownership import ParameterOwnership


def _outside_models(optimizer: torch.optim.Optimizer, in_model: Callable[[torch.Tensor], bool]) -> bool:
    """Whether the optimizer's first parameter is a tensor no model the run ran holds."""
    for group in optimizer.param_groups:
        for param in group.get("params", ()):
            return not in_model(param)
    return False


@dataclass(frozen=True)
class ContractFacts:
    restarts: OptimizerRestarts
    loss_scale: LossScaleTracker
    graph_cuts: GraphCuts
    sampler_epochs: SamplerEpochs
    learning_rates: LearningRates
    rewinds: WeightRewinds
    unfrozen: UnfrozenParams
    replayed_rngs: ReplayedRngs
    wasted_grads: WastedGrads
    eval_weights: EvalWeights
    accumulation: AccumulatedLosses
    schedule_resumes: ScheduleResumes
    epoch_schedules: EpochSchedules
    stored_samples: StoredSamples
    autocast_cache: AutocastCache
    frozen_updates: FrozenUpdates
    epoch_tails: EpochTails
    foreign_grads: ForeignGrads
    fitted_norms: FittedNorms
    schedule_cadence: ScheduleCadence
    clip_bounds: ClipBounds
    schedule_targets: ScheduleTargets
    averaged_copies: AveragedCopies
    resumed_weights: ResumedWeights
    schedule_horizons: ScheduleHorizons
    shared_memory: SharedMemory
    replica_batches: ReplicaBatches
    checkpoint_rng: CheckpointRng
    closure_clears: ClosureClears
    fed_steps: FedSteps
    unstepped: UnsteppedOptimizers
    short_cycles: ShortCycles
    resumed_freezes: ResumedFreezes
    module_flags: ModuleFlags
    partial_clips: PartialClips

    def at_step(self, optimizer: torch.optim.Optimizer, optimizer_name: str,
                roots: Callable[[], list[torch.nn.Module]], ownership: "ParameterOwnership",
                in_model: Callable[[torch.Tensor], bool]) -> dict[str, bool | None]:
        """The contracts judged at an optimizer step, before its ``pre`` event."""
        cycle = self.accumulation.take_cycle(optimizer_name)
        own_cycle = self.accumulation.own_part(optimizer_name, cycle)
        cadence, alike = self.schedule_cadence.judge_step(optimizer, self.loss_scale.updates)
        moves_average, averages_once = self.averaged_copies.judge_step()
        return {
            "keeps_optimizer_state": self.restarts.keeps_state(optimizer),
            "grads_reach_what_ran": self.graph_cuts.reaches_what_ran(optimizer, roots),
            "keeps_learning": self.learning_rates.keeps_learning(optimizer),
            "keeps_trained_weights": self.rewinds.keeps_trained_weights(optimizer),
            "optimizes_unfrozen": self.unfrozen.optimizes_unfrozen(roots(), ownership.live_optimizers),
            "keeps_weights_after_eval": self.eval_weights.keeps_weights_after_eval(
                optimizer, lambda: ownership.digests_held_alone(optimizer), _outside_models(optimizer, in_model)),
            "averages_accumulated_losses": self.accumulation.averages_accumulated_losses(optimizer_name, own_cycle),
            "carries_no_epoch_tail": self.epoch_tails.carries_no_epoch_tail(optimizer_name, cycle),
            "steps_whole_cycles": self.short_cycles.steps_whole_cycles(optimizer_name, own_cycle),
            "keeps_cycle_across_epoch": self.epoch_tails.keeps_cycle_across_epoch(
                optimizer_name, cycle, self.accumulation.cut_by_new_pass(optimizer_name, cycle)),
            "steps_own_grads": self.foreign_grads.steps_own_grads(
                optimizer_name, cycle, self.accumulation.serial,
                ownership.live_optimizers() if ownership.several_optimizers() else [],
                self.averaged_copies.copied_from),
            "keeps_stored_samples": self.stored_samples.keeps_stored_samples(optimizer),
            "fresh_autocast_weights": self.autocast_cache.fresh_autocast_weights(optimizer),
            "keeps_frozen_weights": self.frozen_updates.keeps_frozen_weights(optimizer),
            "freezes_through_parameters": self.module_flags.freezes_through_parameters(optimizer),
            "steps_schedule_with_optimizer": cadence,
            "rescales_groups_alike": alike,
            "steps_clipped_grads": self.clip_bounds.steps_clipped_grads(optimizer),
            "clips_whole_cycles": self.partial_clips.clips_whole_cycles(optimizer),
            "schedules_stepping_optimizer": self.schedule_targets.schedules_stepping_optimizer(optimizer, in_model),
            "updates_move_average": moves_average,
            "averages_once_per_step": averages_once,
            "resumes_loaded_weights": self.resumed_weights.resumes_loaded_weights(optimizer),
            "resumes_trained_parameters": self.resumed_freezes.resumes_trained_parameters(optimizer),
            "anneals_within_horizon": self.schedule_horizons.anneals_within_horizon(optimizer),
            "steps_each_memory_once": self.shared_memory.steps_each_memory_once(optimizer),
            "replays_checkpoint_rng": self.checkpoint_rng.replays_checkpoint_rng(),
        }

    def backward_ran(self, keeps_graph: bool) -> None:
        """Before a backward outside an optimizer's update."""
        self.fed_steps.backward()
        self.wasted_grads.backward_ran(keeps_graph)
        self.clip_bounds.backward_ran()
        self.averaged_copies.backward_ran(self.loss_scale.updates)

    def optimizer_step_ended(self, optimizer: torch.optim.Optimizer) -> None:
        """After an optimizer's step: what the contracts of later calls remember of it."""
        self.restarts.stepped(optimizer)
        self.wasted_grads.step_ended(optimizer)
        self.unstepped.stepped(optimizer)
        self.epoch_schedules.optimizer_stepped(optimizer)
        self.graph_cuts.stepped()
        self.averaged_copies.optimizer_stepped()

    def cycles_cleared(self, optimizer_names: list[str]) -> None:
        """These optimizers' gradients were cleared: their accumulation cycles start again."""
        self.accumulation.cleared(optimizer_names)
        self.foreign_grads.cleared(optimizer_names)
        self.closure_clears.cleared(optimizer_names)
        self.partial_clips.cleared()

    def clip_returned(self, total_norm: Any) -> None:
        """A ``clip_grad_norm_`` returned the norm it measured before clipping."""
        if self.clip_bounds.calling is not None:
            self.partial_clips.clip_returned(*self.clip_bounds.calling, total_norm)

    @classmethod
    def create(cls, ownership: "ParameterOwnership") -> "ContractFacts":
        return cls(OptimizerRestarts(ownership.is_trained), LossScaleTracker(), GraphCuts(), SamplerEpochs(),
                   LearningRates(), WeightRewinds(), UnfrozenParams(), ReplayedRngs(),
                   WastedGrads(), EvalWeights(), AccumulatedLosses(), ScheduleResumes(), EpochSchedules(),
                   StoredSamples(), AutocastCache(), FrozenUpdates(), EpochTails(),
                   ForeignGrads(), FittedNorms(), ScheduleCadence(), ClipBounds(), ScheduleTargets(),
                   AveragedCopies(ownership), ResumedWeights(), ScheduleHorizons(), SharedMemory(),
                   ReplicaBatches(), CheckpointRng(), ClosureClears(),
                   FedSteps(), UnsteppedOptimizers(), ShortCycles(), ResumedFreezes(), ModuleFlags(), PartialClips())
