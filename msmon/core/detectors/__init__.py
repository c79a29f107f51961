"""The rules: one small, pure detector per kind of trouble (the README, "What the thresholds mean", has each one).

`RULES` is the one list of them: the config schema (notifier/config/model.py) and the Monitor read it."""

from __future__ import annotations

from msmon.core.detectors.base import Detector, DetectorContext, Finding, RuleParams
from msmon.core.detectors.convergence import Convergence, ConvergenceParams, LossForecast, LossForecastParams
from msmon.core.detectors.grad_norm import (
    GradNormCreep,
    GradNormCreepParams,
    GradNormParams,
    GradNormSpike,
    GradNormSpikeParams,
    GradNormThreshold,
)
from msmon.core.detectors.loss_collapse import LossCollapse, LossCollapseParams
from msmon.core.detectors.loss_scale import LossScale, LossScaleParams
from msmon.core.detectors.loss_spike import LossSpike, LossSpikeParams
from msmon.core.detectors.lr_schedule import LrSchedule, LrScheduleParams
from msmon.core.detectors.nonfinite import NonFinite, NonFiniteParams
from msmon.core.detectors.stall import StepStall, StepStallParams
from msmon.core.detectors.straggler import Straggler, StragglerParams
from msmon.core.detectors.throughput import ThroughputDrop, ThroughputDropParams
from msmon.core.detectors.vanished import VanishedGrad, VanishedGradParams

# rule name -> (parameters, detector). Order is evaluation order: NaN first.
RULES: dict[str, tuple[type[RuleParams], type[Detector]]] = {
    "nonfinite": (NonFiniteParams, NonFinite),
    "loss_spike": (LossSpikeParams, LossSpike),
    "loss_collapse": (LossCollapseParams, LossCollapse),
    "grad_norm": (GradNormParams, GradNormThreshold),
    "grad_norm_spike": (GradNormSpikeParams, GradNormSpike),
    "grad_norm_creep": (GradNormCreepParams, GradNormCreep),
    "vanished_grad": (VanishedGradParams, VanishedGrad),
    "loss_scale": (LossScaleParams, LossScale),
    "lr_schedule": (LrScheduleParams, LrSchedule),
    "throughput_drop": (ThroughputDropParams, ThroughputDrop),
    "step_stall": (StepStallParams, StepStall),
    "straggler": (StragglerParams, Straggler),
    "convergence": (ConvergenceParams, Convergence),
    "loss_forecast": (LossForecastParams, LossForecast),
}

__all__ = ["RULES", "Detector", "DetectorContext", "Finding", "RuleParams"]
