"""A MindFormers training job as run_mindformer.py runs it, on the CPU, for tests/mindformers (run in the MindFormers
venv: .venv-mf21 or .venv-mf19; `make test` makes them).

    .venv-mf21/bin/python tests/mindformers/job.py --config train.yaml --out DIR [--steps 60] [--seed 0]

What run_mindformer.py does for `--config train.yaml --register_path REGISTER_PATH`, in the same order: REGISTER_PATH
in the environment and on sys.path, `MindFormerConfig(path)` (MindFormers' loader and its config template),
`build_context(config)`, `Trainer(config).train()`. Two things differ, both the
test's and never msmon's: the dataset is a generated one (tokens whose next one follows a pattern, so the loss
falls; `train_dataset=`), and MFTrainOneStepCell takes its IsFinite overflow check on the CPU (the CPU shim below:
MindSpore's GPU/910A paths use FloatStatus / NPUGetFloatStatusV2, which have no CPU kernel).

The YAML may list two test callbacks, registered here in MindFormers' registry as a user's own would be:
- `LrFault` (at_step, factor): from that step the optimizer's LR is `factor` times the schedule's (a runtime
  change of the optimizer's schedule, not announced to msmon: the fault msmon must catch).
- `Operator` (script: [[step, action, arg], ...]): at the end of that step it asks the MsmonCallback for an
  action (scale_lr FACTOR, save_checkpoint, stop, pause SECONDS, resume, rewind STEP), as a chat command does, and
  writes each event msmon raises to OUT/events.jsonl.
OUT/result.json says what the job saw (MindFormers' and MindSpore's versions, the steps trained).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REGISTER_PATH = str(ROOT / "notifier" / "mindformers" / "register")  # notifier.mindformers.REGISTER_PATH
VOCAB, SEQ = 256, 32


def cpu_shim() -> None:
    """MFTrainOneStepCell's overflow check on the CPU: the 910B in-inf-nan path (IsFinite), no AllFinite."""
    import mindspore as ms
    from mindformers.wrapper import MFTrainOneStepCell

    init = MFTrainOneStepCell.__init__

    def cpu_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        init(self, *args, **kwargs)
        if ms.get_context("device_target") == "CPU":
            self.gpu_target = False
            self.ascend_910b_target = True
            self._ascend_check_overflow_mode = None
            self.enable_allfinite = False

    MFTrainOneStepCell.__init__ = cpu_init


def dataset(steps: int, batch: int, seed: int):  # type: ignore[no-untyped-def]
    """`steps` batches of token ids, each sequence counting up by a stride of its own from a random start, with 10%
    of the tokens random: a pattern a tiny LLaMA learns in a few dozen steps (the loss falls from ln 256)."""
    import mindspore as ms
    import numpy as np

    rng = np.random.default_rng(seed)
    n = steps * batch
    start = rng.integers(0, VOCAB, size=(n, 1))
    stride = rng.integers(1, 4, size=(n, 1))
    rows = (start + stride * np.arange(SEQ + 1)) % VOCAB
    noise = rng.random(rows.shape) < 0.1
    rows = np.where(noise, rng.integers(0, VOCAB, size=rows.shape), rows).astype(np.int32)
    return ms.dataset.GeneratorDataset(lambda: ((r,) for r in rows), column_names=["input_ids"],
                                       shuffle=False).batch(batch, drop_remainder=True)


def register_test_callbacks(out: Path) -> None:
    import mindspore as ms
    from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
    from mindspore import nn, ops

    class FaultLR(nn.learning_rate_schedule.LearningRateSchedule):  # type: ignore[misc]
        def __init__(self, schedule) -> None:  # type: ignore[no-untyped-def]
            super().__init__()
            self.schedule = schedule
            self.factor = ms.Parameter(ms.Tensor(1.0, ms.float32), name="fault_factor", requires_grad=False)

        def construct(self, global_step):  # type: ignore[no-untyped-def]
            return self.schedule(global_step) * self.factor

    class LrFault(ms.train.Callback):  # type: ignore[misc]
        def __init__(self, at_step: int, factor: float = 30.0) -> None:
            super().__init__()
            self.at_step, self.factor, self.lr = int(at_step), float(factor), None

        def on_train_begin(self, run_context):  # type: ignore[no-untyped-def]
            opt = run_context.original_args().train_network.optimizer
            self.lr = opt.learning_rate = FaultLR(opt.learning_rate)

        def on_train_step_end(self, run_context):  # type: ignore[no-untyped-def]
            if int(run_context.original_args().cur_step_num) == self.at_step - 1:
                ops.assign(self.lr.factor, ms.Tensor(self.factor, ms.float32))  # the next step trains at it

    class Operator(ms.train.Callback):  # type: ignore[misc]
        def __init__(self, script: list | None = None) -> None:  # type: ignore[type-arg]
            super().__init__()
            self.script = {int(s[0]): (str(s[1]), *s[2:]) for s in script or []}
            self.msmon = None

        def on_train_begin(self, run_context):  # type: ignore[no-untyped-def]
            from notifier.mindformers import MsmonCallback

            found = [c for c in run_context.original_args().list_callback if isinstance(c, MsmonCallback)]
            self.msmon = found[0]
            events = open(out / "events.jsonl", "a", encoding="utf-8")  # noqa: SIM115 - open for the run

            def on_event(ev):  # type: ignore[no-untyped-def]
                events.write(json.dumps({"step": ev.step, "rule": ev.rule, "severity": str(ev.severity.name),
                                         "status": str(ev.status.name), "message": ev.message}) + "\n")
                events.flush()

            self.msmon.on_event = on_event

        def on_train_step_end(self, run_context):  # type: ignore[no-untyped-def]
            todo = self.script.get(int(run_context.original_args().cur_step_num))
            if todo is None:
                return
            action, *args = todo
            if action == "rewind":  # to the health checkpoint of step args[0] (chat: rewind to N)
                self.msmon.control.request("rewind", source="chat", to=int(args[0]))
            else:
                getattr(self.msmon, action)(*args)

    MindFormerRegister.register_cls(LrFault, MindFormerModuleType.CALLBACK)
    MindFormerRegister.register_cls(Operator, MindFormerModuleType.CALLBACK)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out = Path(args.out).resolve()
    config_path = str(Path(args.config).resolve())
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(out)  # MindFormers writes ./output, msmon ./msmon_logs unless told otherwise
    # run_mindformer.py --register_path: the environment variable auto_register reads, and sys.path
    os.environ["REGISTER_PATH"] = REGISTER_PATH
    sys.path.append(REGISTER_PATH)

    import mindformers
    import mindspore as ms
    from mindformers import MindFormerConfig, Trainer, build_context

    cpu_shim()
    register_test_callbacks(out)
    config = MindFormerConfig(config_path)
    config.seed = args.seed
    build_context(config)
    batch = int(config.runner_config.batch_size)
    trainer = Trainer(config, train_dataset=dataset(args.steps, batch, args.seed))
    trainer.train()
    (out / "result.json").write_text(json.dumps({"mindformers": mindformers.__version__,
                                                 "mindspore": ms.__version__}))


if __name__ == "__main__":
    main()
