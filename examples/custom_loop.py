"""msmon in a custom MindSpore training loop (mindspore.value_and_grad), no Model.train.

    python examples/custom_loop.py [--steps 300] [--config config/monitor.yaml] [--run-id my-run]

The grad norm is computed inside the compiled step with `notifier.mindspore.global_norm` and
returned with the loss; `Monitor.step` gets called on every step (it only samples every
`step_interval`-th), and the events it returns carry the configured actions. A `JobControl` runs
those actions, and the bot's chat commands when `monitor_config.bot.url` is set, at the step
boundary: `control.apply(step)` after each step.

JobControl knows no framework. Pause, resume and the threshold commands need nothing more; for
save-checkpoint, scale-lr and a stop's checkpoint it asks a backend, here `LoopBackend` below (three
methods, notifier.control.Backend; `JobControl(mon)` alone answers that those need one). With
Model.train, MonitorCallback brings notifier.mindspore's MindSporeBackend instead.

Rewind (docs/rewind.md): with `--ring` the loop keeps health checkpoints (`control.step_end(step)` after each
step) and LoopBackend has the rest of notifier.control.RewindBackend: it reads and restores its checkpoints, and
its data position is `self.position`, the batches read so far: `seek_data` moves it (the documented hook for a
custom loop's data: the next batch read is the one at that position). After `control.apply(step)`,
`control.take_rewound_to()` is the step the training carries on from. `clip-grad` changes the GradClip passed into the
compiled step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import mindspore as ms
import numpy as np
from mindspore import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from notifier import JobControl, Monitor, Status  # noqa: E402
from notifier.control import ActionError  # noqa: E402
from notifier.mindspore import global_norm  # noqa: E402
from notifier.mindspore.grad_norm import GradClip, clip_live  # noqa: E402


class LoopBackend:
    """This loop's part of the job actions: its network's and optimizer's checkpoints, its optimizer's LR
    Parameter, its data position and its grad clip."""

    def __init__(self, net: nn.Cell, opt: nn.Optimizer, lr: ms.Parameter, clip: GradClip,
                 checkpoint_dir: str = "./checkpoints") -> None:
        self.net, self.opt, self.lr, self.clip, self.checkpoint_dir = net, opt, lr, clip, checkpoint_dir
        self.position = 0  # batches read so far: the next batch is batch `position`

    def _params(self) -> list[ms.Parameter]:  # the weights and the optimizer's state (its step, its LR)
        return list(self.net.get_parameters()) + [p for p in self.opt.get_parameters() if p.name != "msmon_clip_norm"]

    def save_checkpoint(self, step: int, name: str, directory: str | None = None) -> str:
        folder = directory or self.checkpoint_dir
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{name}.ckpt")  # `name` is file-safe (run, device, step)
        ms.save_checkpoint(self._params(), path)
        return path

    def read_checkpoint(self, path: str) -> dict:
        saved = ms.load_checkpoint(path)  # refuses a damaged file before anything changes
        missing = [p.name for p in self._params() if p.name not in saved]
        if missing:
            raise ActionError(f"{path} lacks {missing[:3]}: not this loop's checkpoint; nothing was changed")
        return saved

    def restore(self, loaded: dict) -> str:
        for p in self._params():
            ms.ops.assign(p, ms.Tensor(loaded[p.name].asnumpy()))  # what the compiled step sees
        return "weights and optimizer restored"

    def data_position(self, run_context: object) -> int:
        return self.position

    def seek_data(self, position: int, run_context: object) -> str:
        self.position = position
        return f"data moved to batch {position}"

    def delete_checkpoint(self, path: str) -> None:
        if os.path.exists(path):
            os.remove(path)

    def clip_grad(self, max_norm: float) -> str:
        return self.clip.set(max_norm)

    def scale_lr(self, factor: float) -> str:
        before = float(self.lr.asnumpy())
        ms.ops.assign(self.lr, ms.Tensor(before * factor, ms.float32))  # set_data would not reach a compiled step
        return f"lr {before:.3g} -> {before * factor:.3g}"

    def stop(self, run_context: object) -> None:
        pass  # this loop ends itself on control.stop_requested


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--config", default=None, help="monitor config (default: every step, all rules)")
    ap.add_argument("--lr-jump-at", type=int, default=None, help="raise the LR at this step (a fault to catch)")
    ap.add_argument("--lr-jump-to", type=float, default=0.6)
    ap.add_argument("--run-id", default="custom-loop", help="the run's name in alerts and commands (default "
                    "custom-loop): `msmon cmd \"status RUN_ID\"`")
    ap.add_argument("--step-time", type=float, default=0.0, help="seconds each step takes at least (a slower job, "
                    "to watch it and command it; default: as fast as it goes)")
    ap.add_argument("--ring", action="store_true", help="keep health checkpoints every 50 steps, so that `rewind` "
                    "has one to load (docs/rewind.md)")
    args = ap.parse_args()
    ms.set_device("CPU")  # set_context(device_target=...) is deprecated since MindSpore 2.6
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, 32)).astype(np.float32)
    y = (x @ (rng.standard_normal((32, 1)) / np.sqrt(32)) + 0.5 * rng.standard_normal((2048, 1))).astype(np.float32)
    batch = 256
    batches = [(ms.Tensor(x[i:i + batch]), ms.Tensor(y[i:i + batch])) for i in range(0, len(x), batch)]

    net = nn.SequentialCell(nn.Dense(32, 64), nn.ReLU(), nn.Dense(64, 1))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    lr = opt.learning_rate  # the optimizer's own Parameter (it copies whatever it is given)
    loss_fn = nn.MSELoss()

    def forward(inputs, labels):
        return loss_fn(net(inputs), labels)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    clip = GradClip()  # no clipping until `clip-grad <run> <max_norm>`

    @ms.jit
    def train_step(inputs, labels):
        loss, grads = grad_fn(inputs, labels)
        norm = global_norm(grads)  # inside the compiled step: a few small kernels
        opt(clip_live(grads, norm, clip.value))
        return loss, norm

    config = args.config or {"monitor_config": {"monitor_on": True, "step_interval": 1, "log_interval": 50,
                                                "alert": {"baseline_steps": 100},
                                                "checkpoint_ring": {"enable": args.ring, "every_steps": 50}}}
    samples = batch
    with Monitor(config, run_id=args.run_id) as mon:
        backend = LoopBackend(net, opt, lr, clip)  # what checkpoints save, whose LR scale_lr scales, the data position
        control = JobControl(mon, backend)
        control.listen()  # chat commands from the bot, when monitor_config.bot.url is set
        step = 0
        while step < args.steps:
            step += 1
            if args.lr_jump_at is not None and step == args.lr_jump_at:
                ms.ops.assign(lr, ms.Tensor(args.lr_jump_to, ms.float32))  # set_data would not reach a compiled step
            xb, yb = batches[backend.position % len(batches)]
            backend.position += 1
            loss, norm = train_step(xb, yb)
            if args.step_time:
                time.sleep(args.step_time)
            if mon.samples(step):  # read tensors only on sampled steps: .asnumpy() costs ~15 us
                events = mon.step(step, loss=float(loss.asnumpy()), grad_norm=float(norm.asnumpy()),
                                  lr=float(lr.asnumpy()), samples=samples)
            else:
                events = mon.step(step, samples=samples)
            for e in events:
                if e.status is Status.RESOLVED:
                    print(f"RESOLVED step {e.step} {e.rule}: back to normal (it was {e.severity.value})")
                else:
                    print(f"ALERT step {e.step} {e.severity.value} {e.rule}: {e.message}")
                control.take_event(e)  # the configured actions of this rule
            control.step_end(step)  # health checkpoints (--ring): a few comparisons on most steps
            if control.has_pending:
                # at the step boundary, in the order the bot accepted them: checkpoint, scale the LR, ...; a pause
                # waits in here until a resume, a stop or its timeout (that time is not counted as step time)
                control.apply(step)
                rewound_to = control.take_rewound_to()
                if rewound_to is not None:  # a rewind: carry on from the checkpoint's step
                    step = rewound_to
                if control.stop_requested:
                    break


if __name__ == "__main__":
    main()
