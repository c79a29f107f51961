"""One entry in the training YAML's callbacks list attaches msmon: MindFormers' own config loader
(MindFormerConfig, with its config template) and msmon's (`msmon check-config`) accept and refuse the same files, on
every MindFormers release `make test` builds a venv for. msmon's keys inside monitor_config are refused by both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from msmon.config.errors import ConfigError
from notifier.config import load_config
from tests.mindformers.harness import BASE_YAML, ROOT, run_python

pytestmark = [pytest.mark.mindspore]

LOAD_WITH_MINDFORMERS = """
import json, sys
from mindformers import MindFormerConfig
out = {}
for path in sys.argv[1:]:
    try:
        MindFormerConfig(path)
        out[path] = None
    except Exception as e:
        out[path] = f"{type(e).__name__}: {e}"
print("RESULT " + json.dumps(out))
"""


def _variant(tmp: Path, name: str, edit) -> str:  # type: ignore[no-untyped-def]
    data = yaml.safe_load(BASE_YAML.read_text())
    edit(data)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_mindformers_loader_and_check_config_accept_and_refuse_the_same_yaml(mf_python, tmp_path):
    def entry(d):  # type: ignore[no-untyped-def]
        return next(c for c in d["callbacks"] if c["type"] == "MsmonCallback")

    good = [
        str(BASE_YAML),
        str(ROOT / "config" / "mindformers_example.yaml"),
        _variant(tmp_path, "entry_settings", lambda d: entry(d).update(
            actions=[{"rule": "grad_norm", "severity": "ERROR", "action": "save_checkpoint"}],
            bot={"url": "http://127.0.0.1:9"}, alert={"rules": {"grad_norm": {"error": 5.0}}})),
        _variant(tmp_path, "mindformers_keys", lambda d: d["monitor_config"].update(
            check_for_global_norm=True, global_norm_spike_threshold=4.0, step_interval=2)),
    ]
    bad = {  # the key MindFormers names in its KeyError, and msmon in its message
        _variant(tmp_path, "actions_in_monitor_config", lambda d: d["monitor_config"].update(
            actions=[{"rule": "grad_norm", "severity": "ERROR", "action": "save_checkpoint"}])): "actions",
        _variant(tmp_path, "bot_in_monitor_config", lambda d: d["monitor_config"].update(
            bot={"url": "http://127.0.0.1:9"})): "bot",
        _variant(tmp_path, "typo_in_monitor_config", lambda d: d["monitor_config"].update(
            chek_for_global_norm=True)): "chek_for_global_norm",
        _variant(tmp_path, "callback_without_type", lambda d: d["callbacks"].append({"per_print_times": 1})): "type",
    }
    out = run_python(mf_python, LOAD_WITH_MINDFORMERS, *good, *bad, cwd=tmp_path)
    verdicts = json.loads(out.split("RESULT ", 1)[1])
    for path in good:
        assert verdicts[path] is None, f"MindFormers refuses {path}: {verdicts[path]}"
        cfg = load_config(path)
        assert cfg.monitor_on
    for path, key in bad.items():
        assert verdicts[path] is not None and f"key: {key}" in verdicts[path], verdicts[path]
        with pytest.raises(ConfigError) as err:
            load_config(path)
        assert f"monitor_config.{key}" in str(err.value) or f"required key: {key}" in str(err.value)
    taken = {t.key: t for t in load_config(good[3]).mindformers}
    assert load_config(good[3]).step_interval == 2  # monitor_config.step_interval: msmon's interval too
    assert load_config(good[3]).alert.rules.grad_norm.error == 4.0  # check_for_global_norm's threshold
    assert taken["monitor_config.monitor_on"].acted is False  # MindFormers' own monitor's switch
    assert load_config(good[2]).alert.rules.grad_norm.error == 5.0 and load_config(good[2]).actions
