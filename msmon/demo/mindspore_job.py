"""The demo's real training job: the toy regression (full batch, SGD) with a bad learning-rate schedule, the
kind of change that ends a run. The schedule itself is wrong (a warmup to 0.05, then, from step `at`, every
value multiplied by `jump`, as a mistyped peak LR or a restart that applies its scale twice does); nothing
tells msmon, which has to see it in the logged LR and in what it does to the training. The job reports to
the bot like any job: a MonitorCallback with `bot.url`, so chat commands reach it too."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import mindspore as ms

from msmon.contract.wire import Event
from notifier import Monitor
from notifier.config import load_config
from notifier.mindspore.callback import MonitorCallback
from notifier.mindspore.toy import dataset, model, regression_data
from notifier.transport import BotTransport

BASE_LR = 0.05
WARMUP = 50
AT, JUMP = 200, 8.0  # the demo's fault: from step 200 the schedule gives 8x its LR


def bad_schedule(steps: int, at: int, jump: float, base: float = BASE_LR, warmup: int = WARMUP) -> list[float]:
    """Per-step learning rates: a linear warmup to `base` over `warmup` steps, then `base`, and from the
    1-based step `at` on `base * jump` (MindSpore takes a list as a dynamic LR, one value per step)."""
    return [base * min(1.0, (i + 1) / warmup) * (jump if i + 1 >= at else 1.0) for i in range(steps)]


class _Pace(ms.train.Callback):  # type: ignore[misc]
    """Paces the steps so a person (or the demo) can act while the job runs."""

    def __init__(self, step_sleep: float) -> None:
        super().__init__()
        self.step_sleep = step_sleep

    def on_train_step_end(self, run_context: Any) -> None:
        time.sleep(self.step_sleep)


def monitor_config(bot_url: str, token_env: str, spool_dir: str) -> dict[str, Any]:
    return {"monitor_config": {
        "monitor_on": True, "step_interval": 1, "log_interval": 0,
        "alert": {"baseline_steps": 100, "rules": {"loss_spike": {"consecutive": 2}}},
        "bot": {"url": bot_url, "token_env": token_env, "heartbeat_interval": 1.0, "spool_dir": spool_dir}}}


class UnstableJob:
    """The toy MLP trained on a thread of its own with `bad_schedule(at, jump)`; `events` are the alerts its
    Monitor raised (what it also sent to the bot)."""

    def __init__(self, bot_url: str, token_env: str, out_dir: str, run_id: str = "demo-ms", at: int = AT,
                 jump: float = JUMP, step_sleep: float = 0.02, max_steps: int = 20_000) -> None:
        ms.set_device("CPU")
        ms.set_context(mode=ms.GRAPH_MODE)
        self.run_id, self.at, self.jump = run_id, at, jump
        self.events: list[Event] = []
        cfg = load_config(monitor_config(bot_url, token_env, f"{out_dir}/spool"))
        # The job's transport sends an ERROR at once and lets the rest wait up to 1 s for company; at this toy's
        # 50 steps a second that would deliver a resolution after the next ERROR. The demo sends everything in
        # 10 ms, so the console reads in the order things happened.
        transport = BotTransport(bot_url, run_id, "0", os.environ.get(token_env, ""), spool_dir=cfg.bot.spool_dir,
                                 heartbeat_interval=cfg.bot.heartbeat_interval, flush_interval=0.01)
        self.callback = MonitorCallback(cfg, run_id=run_id, checkpoint_dir=f"{out_dir}/checkpoints",
                                        on_event=self.events.append, monitor=Monitor(cfg, run_id, transport=transport))
        self._pace = _Pace(step_sleep)
        x, y = regression_data()
        self._model, _, _ = model(lr=bad_schedule(max_steps, at, jump))
        self._data = dataset(x, y, len(x), max_steps)
        self.thread = threading.Thread(target=self._train, name="msmon-demo-job", daemon=True)

    def _train(self) -> None:
        self._model.train(1, self._data, callbacks=[self._pace, self.callback], dataset_sink_mode=False)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)
