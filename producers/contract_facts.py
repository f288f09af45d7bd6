"""What the producer keeps to judge the API contracts it evaluates on calls.

Each contract of `invariants.events.CONTRACTS` needs a little memory of the program's
live objects: which optimizers stepped with state, whether a loss scale is pending,
which modules ran with gradients since the last step, which sampler passes began,
which optimizers have learned and for how many steps their rates have been zero,
what each parameter held before its first update, which frozen parameters to watch,
which dataset RNG state the workers of the latest training pass started from, whether
the latest backward's gradients are still unused, the weights each optimizer left at
its latest step.
They live together here so that the tracer holds one object for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .amp_scaling import LossScaleTracker
from .eval_weights import EvalWeights
from .graph_cuts import GraphCuts
from .learning_rates import LearningRates
from .optimizer_restarts import OptimizerRestarts
from .replayed_rngs import ReplayedRngs
from .sampler_epochs import SamplerEpochs
from .unfrozen_params import UnfrozenParams
from .wasted_grads import WastedGrads
from .weight_rewinds import WeightRewinds


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

    @classmethod
    def create(cls, is_trained: Callable[[torch.Tensor], bool]) -> "ContractFacts":
        return cls(OptimizerRestarts(is_trained), LossScaleTracker(), GraphCuts(), SamplerEpochs(),
                   LearningRates(), WeightRewinds(), UnfrozenParams(), ReplayedRngs(),
                   WastedGrads(), EvalWeights())
