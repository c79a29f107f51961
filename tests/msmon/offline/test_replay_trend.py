"""`msmon replay`'s loss trend is a robust fit (issue 19): a spike that fills whole blocks of steps no longer
tilts it. The same log without the spike is the reference."""

from __future__ import annotations

import math
import random
from pathlib import Path

from msmon.cli.main import main
from msmon.offline.replay import run_replay
from msmon.offline.robust import despike, theil_sen

CONFIG = "monitor_config:\n  monitor_on: true\n  step_interval: 1\n"


def _log(path: Path, spike: bool) -> Path:
    rng = random.Random(3)
    rows = ["step,loss"]
    for step in range(1, 6001):
        loss = 3.0 - 0.25 * math.log(step) + rng.gauss(0.0, 0.01)
        if spike and 5000 <= step < 5250:  # a bad shard: 250 steps 1.5 higher, then back
            loss += 1.5
        rows.append(f"{step},{loss:.5f}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_theil_sen_ignores_a_minority_of_outliers() -> None:
    xs = [float(i) for i in range(10)]
    ys = [2.0 * x + 1.0 for x in xs]
    ys[7] = ys[8] = 100.0
    slope, icpt = theil_sen(xs, ys)
    assert abs(slope - 2.0) < 1e-9 and abs(icpt - 1.0) < 1e-9
    cleaned = despike(list(range(1, 11)), [1.0] * 10, window_steps=10)
    assert cleaned.set_aside == 0  # a flat line has no spikes (and no spread: nothing is judged)


def test_a_spike_does_not_tilt_the_replays_trend(tmp_path: Path) -> None:
    cfg = tmp_path / "m.yaml"
    cfg.write_text(CONFIG)
    clean, _ = run_replay(str(_log(tmp_path / "clean.csv", spike=False)), str(cfg)).trend()
    result = run_replay(str(_log(tmp_path / "spiked.csv", spike=True)), str(cfg))
    plain, _ = result.trend(robust=False)
    robust, how = result.trend()
    assert clean is not None and plain is not None and robust is not None and how is not None
    assert how.set_aside >= 2 and how.blocks >= 20
    truth = clean.slope_per_1000
    assert abs(plain.slope_per_1000 - truth) > 3 * abs(robust.slope_per_1000 - truth), (
        plain.slope_per_1000, robust.slope_per_1000, truth)
    assert abs(robust.loss_now - clean.loss_now) < 0.02
    assert robust.verdict == clean.verdict


def test_replay_says_it_set_the_spike_aside(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "m.yaml"
    cfg.write_text(CONFIG)
    assert main(["replay", str(_log(tmp_path / "spiked.csv", spike=True)), "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "trend: robust fit: " in out and "blocks of steps were spikes off a Theil-Sen line" in out
