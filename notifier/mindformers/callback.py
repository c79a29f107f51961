"""`MsmonCallback`: msmon's MonitorCallback as MindFormers builds it from a training YAML's callbacks list.

MindFormers instantiates a callback entry with the entry's keys as arguments (`MindFormerRegister.
get_instance_from_cfg`): `run_id`, `checkpoint_dir`, `seq_length`, `pause_timeout`, `resume_from` and `device` are
the callback's; every other key is an msmon monitor setting (docs/user-guide/monitor-config.md). MindFormers' own
`monitor_config` keys, its switches and `tensorboard:` section come from the training config MindFormers' context
holds (`build_context(config)`, which run_mindformer.py calls before building the Trainer), read as msmon's config
loader reads the file: `msmon check-config train.yaml` says the same.

At train begin the schedule MindFormers built from `lr_schedule:` is made scalable (ScalableLR) and MindFormers'
train cell reports the optimizer's real LR instead of its deep copy (notifier.mindspore.lr.share_lr): a chat
`scale-lr` then shows in MindFormers' log line, its TensorBoard and msmon's records alike.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from msmon.config.errors import ConfigError

from ..config.mindformers import CALLBACK
from ..mindspore.callback import MonitorCallback, _rank

log = logging.getLogger("msmon")


def _plain(value: Any) -> Any:
    """A config value as YAML would give it: mappings and lists rebuilt, scalars kept, anything else (a class
    MindFormers' template puts as a default) dropped as None."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return None


def _template_defaults() -> dict[str, Any]:
    """MindFormers' template defaults of monitor_config (what MindFormerConfig fills in for keys a file left out)."""
    try:
        from mindformers.tools.register.template import MonitorConfig as Template
    except ImportError:  # a MindFormers without the template (before 1.6): it fills nothing in
        return {}
    return {k: getattr(Template, k) for k in Template.keys()}  # noqa: SIM118 - a class method, not a dict's


def training_config(config: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The training config as the YAML said it: `config`, else the one MindFormers' context holds (None when
    build_context was not called). monitor_config keys MindFormers' template filled in with its defaults are left
    out, so that msmon records the keys the file set, as `msmon check-config FILE` does."""
    if config is None:
        try:
            from mindformers.core.context.build_context import Context
        except ImportError:
            return None
        config = getattr(getattr(Context, "_instance", None), "config", None)
        if not isinstance(config, Mapping):
            return None
    top: dict[str, Any] = _plain(config)
    section = top.get("monitor_config")
    if isinstance(section, dict):
        defaults = _template_defaults()
        top["monitor_config"] = {k: v for k, v in section.items()
                                 if not (k in defaults and (v is None or _plain(defaults[k]) == v))}
    return top


class MsmonCallback(MonitorCallback):
    """msmon inside MindFormers' Trainer; MindFormers builds it from `- type: MsmonCallback` in `callbacks:`.

    run_id: shown in every line and alert (default: the config's trainer.model_name, else "run").
    checkpoint_dir: where save_checkpoint, stop and health checkpoints write (default:
    OUTPUT_DIR/msmon_checkpoint/rank_N). The other keyword arguments are msmon's monitor settings.
    """

    def __init__(self, run_id: str | None = None, *, checkpoint_dir: str | None = None, seq_length: int | None = None,
                 pause_timeout: float | None = None, resume_from: str | bool | None = None,
                 device: str | int | None = None, **settings: Any) -> None:
        top = training_config() or {}
        entry = {"type": CALLBACK, **_plain(settings)}
        data = {**{k: v for k, v in top.items() if k != "callbacks"}, "callbacks": [entry]}
        rank = _rank() if device is None else str(device)
        if checkpoint_dir is None:
            out = top.get("output_dir")
            out = out if isinstance(out, str) else "./output"
            checkpoint_dir = os.path.join(out, "msmon_checkpoint", f"rank_{rank}")
        if run_id is None:
            trainer = top.get("trainer")
            name = trainer.get("model_name") if isinstance(trainer, Mapping) else None
            run_id = name if isinstance(name, str) and name else "run"
        try:
            super().__init__(data, run_id, device=rank, checkpoint_dir=checkpoint_dir, seq_length=seq_length,
                             pause_timeout=pause_timeout, resume_from=resume_from)
        except ConfigError as e:
            # MindFormers reports a callback's exception as "MsmonCallback: <message>"; the message names the keys
            raise ConfigError(e.issues, "the MsmonCallback entry of the training YAML's callbacks") from None
        self.backend.wrap_lr = True  # MindFormers builds the schedule from lr_schedule: msmon wraps it to scale it
        if not top:
            log.info("msmon: run %s: MindFormers' context holds no training config (build_context was not called), "
                     "so MindFormers' monitor_config keys are not taken into msmon's settings", run_id)

    def on_train_begin(self, run_context: Any) -> None:
        super().on_train_begin(run_context)
        if self.backend.lr_note:
            log.info("msmon: run %s: %s", self.monitor.run_id, self.backend.lr_note)
