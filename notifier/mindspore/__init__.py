"""msmon for MindSpore: the callback, grad-norm train steps, live LR scaling, job actions.

Importing this module imports MindSpore (`pip install msmon[mindspore]`); `notifier` itself does not.
`JobControl` is framework-neutral (notifier/control/); `MindSporeBackend` is its MindSpore part.
"""

from ..control import ActionError, JobControl
from .backend import MindSporeBackend
from .callback import MonitorCallback, parse_outputs
from .grad_norm import METRICS, TrainStepWithGradNorm, TrainStepWithGradNormLossScale, global_norm, pack_metrics
from .lr import ScalableLR
from .reads import HostReads

__all__ = [
    "METRICS",
    "ActionError",
    "HostReads",
    "JobControl",
    "MindSporeBackend",
    "MonitorCallback",
    "ScalableLR",
    "TrainStepWithGradNorm",
    "TrainStepWithGradNormLossScale",
    "global_norm",
    "pack_metrics",
    "parse_outputs",
]
