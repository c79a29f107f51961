"""The demo's real training job: the toy regression (full batch, SGD) whose learning rate is raised
at one step, the kind of bad schedule change that ends a run. It reports to the bot like any job:
a MonitorCallback with `bot.url`, so chat commands reach it too."""

from __future__ import annotations

import threading
import time
from typing import Any

import mindspore as ms

from notifier.mindspore.callback import MonitorCallback
from notifier.mindspore.toy import dataset, model, regression_data


class _Schedule(ms.train.Callback):  # type: ignore[misc]
    """Raises the LR `jump`-fold at step `at` (through the job's own scale_lr action) and paces the
    steps so a person (or the demo) can act while it runs."""

    def __init__(self, cb: MonitorCallback, at: int, jump: float, step_sleep: float) -> None:
        super().__init__()
        self.cb, self.at, self.jump, self.step_sleep = cb, at, jump, step_sleep

    def on_train_step_end(self, run_context: Any) -> None:
        if run_context.original_args().cur_step_num == self.at:
            self.cb.control.request("scale_lr", source="the demo's bad LR schedule", factor=self.jump)
        time.sleep(self.step_sleep)


def monitor_config(bot_url: str, token_env: str, spool_dir: str) -> dict[str, Any]:
    return {"monitor_config": {
        "monitor_on": True, "step_interval": 1, "log_interval": 0,
        "alert": {"baseline_steps": 100, "rules": {"loss_spike": {"consecutive": 2}}},
        "bot": {"url": bot_url, "token_env": token_env, "heartbeat_interval": 1.0, "spool_dir": spool_dir}}}


class UnstableJob:
    def __init__(self, bot_url: str, token_env: str, out_dir: str, run_id: str = "demo-ms", at: int = 300,
                 jump: float = 3.0, step_sleep: float = 0.02, max_steps: int = 20_000) -> None:
        ms.set_device("CPU")
        ms.set_context(mode=ms.GRAPH_MODE)
        self.run_id = run_id
        self.callback = MonitorCallback(monitor_config(bot_url, token_env, f"{out_dir}/spool"), run_id=run_id,
                                        checkpoint_dir=f"{out_dir}/checkpoints")
        self._schedule = _Schedule(self.callback, at, jump, step_sleep)
        x, y = regression_data()
        self._model, _, _ = model(lr=0.05)
        self._data = dataset(x, y, len(x), max_steps)
        self.thread = threading.Thread(target=self._train, name="msmon-demo-job", daemon=True)

    def _train(self) -> None:
        self._model.train(1, self._data, callbacks=[self._schedule, self.callback], dataset_sink_mode=False)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)
