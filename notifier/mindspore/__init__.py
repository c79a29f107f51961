"""msmon for MindSpore: the callback, grad-norm train steps, live LR scaling, job actions.

Importing this module imports MindSpore (`pip install msmon[mindspore]`); `notifier` itself does not.
"""

from .callback import MonitorCallback, parse_outputs
from .control import ACTIONS, JobControl
from .grad_norm import TrainStepWithGradNorm, TrainStepWithGradNormLossScale, global_norm
from .lr import ActionError, ScalableLR

__all__ = [
    "ACTIONS",
    "ActionError",
    "JobControl",
    "MonitorCallback",
    "ScalableLR",
    "TrainStepWithGradNorm",
    "TrainStepWithGradNormLossScale",
    "global_norm",
    "parse_outputs",
]
