"""`HostReads`: every device-to-host copy msmon makes on a training step goes through one counter.

On Ascend each `Tensor.asnumpy()` is a copy to the host and a wait for the device, so how many of them
a sampled step costs matters more than anything else the callback does. `MonitorCallback.reads.count`
says how many it made; a benchmark or a test reads it instead of patching MindSpore.
"""

from __future__ import annotations

from typing import Any


class HostReads:
    """A counting `asnumpy()`: `reads(tensor)` copies the tensor to the host and counts one read."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, tensor: Any) -> Any:
        self.count += 1
        return tensor.asnumpy()


def uncounted(tensor: Any) -> Any:
    """A plain `asnumpy()`, for reads off the step path (actions) and for callers that count nothing."""
    return tensor.asnumpy()
