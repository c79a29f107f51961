"""`MindSporeBackend`: what JobControl's checkpoint, scale_lr and stop do in a MindSpore training.

    backend = MindSporeBackend("./checkpoints")
    backend.bind(net, optimizer)  # MonitorCallback does this at on_train_begin
    control = JobControl(monitor, backend)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import mindspore as ms

from msmon.common.safenames import inside

from ..control import ActionError
from .lr import LrHandle, global_step, lr_handles
from .reads import uncounted


class MindSporeBackend:
    """Checkpoints of the bound network, the bound optimizer's LR, `run_context.request_stop()`."""

    def __init__(self, checkpoint_dir: str = "./checkpoints", read: Any = uncounted) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.read = read  # makes read_lr's device-to-host copies (MonitorCallback passes its HostReads)
        self.train_network: Any = None
        self.optimizer: Any = None
        self._handles: list[LrHandle] | None = None  # the optimizer's LRs, made once (a list LR is kept on the host)
        self.on_saved: Callable[[str], object] | None = None  # told each checkpoint written (MonitorCallback saves
        # the monitor's state next to it)

    def bind(self, train_network: Any, optimizer: Any) -> None:
        """What save_checkpoint saves, and whose LR scale_lr scales."""
        self.train_network, self.optimizer = train_network, optimizer
        self._handles = None

    def _lr_handles(self) -> list[LrHandle]:
        if self._handles is None:
            self._handles = lr_handles(self.optimizer)
        return self._handles

    def save_checkpoint(self, step: int, name: str) -> str:
        if self.train_network is None:
            raise ActionError("no network to save yet (training has not started)")
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        path = inside(self.checkpoint_dir, f"{name}.ckpt")  # whatever `name` holds, the file stays in the folder
        ms.save_checkpoint(self.train_network, path)
        if self.on_saved is not None:
            self.on_saved(path)
        return path

    def scale_lr(self, factor: float) -> str:
        opt = self.optimizer
        if opt is None:
            raise ActionError("no optimizer known yet (training has not started)")
        handles = self._lr_handles()
        idx = max(global_step(opt) - 1, 0)
        before = [h.read(idx) for h in handles]
        for h in handles:
            h.scale(factor)
        after = [h.read(idx) for h in handles]
        return "lr " + ", ".join(f"{a:.3g} -> {b:.3g}" for a, b in zip(before, after, strict=True))

    def read_lr(self, steps_ago: int = 0) -> float | None:
        """The LR of the last optimizer step, or of the one `steps_ago` steps before it (of the first
        parameter group); None when unknown. Host reads: one for a fixed LR or a list (copied to the host
        once), two and an evaluation for a schedule."""
        opt = self.optimizer
        if opt is None:
            return None
        try:
            handle = self._lr_handles()[0]
            index = 0 if handle.fixed else global_step(opt, self.read) - 1 - steps_ago
            return handle.read(index, self.read)
        except Exception:  # noqa: BLE001 - an exotic optimizer: no LR, but never a crash
            return None

    def stop(self, run_context: Any) -> None:
        if run_context is not None:
            run_context.request_stop()
