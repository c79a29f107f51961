"""A check of the cross-rank rules looks at the runs heard from since the previous check (and those with an
alert firing), not at every run kept: its cost follows what reported. A straggler in a run that keeps
reporting is still found."""

from __future__ import annotations

from collections import OrderedDict

import pytest

import bot.ranks as ranks_mod
from bot.config import RanksConfig
from bot.ranks import check
from bot.ranks.view import RankViews
from msmon.contract.wire import Envelope, Sample


@pytest.fixture
def judged(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runs each check judges, in order (bot/ranks `track` counted)."""
    seen: list[str] = []
    track = ranks_mod.track

    def counted(rules, ctx, run):  # type: ignore[no-untyped-def]
        seen.append(run.run_id)
        return track(rules, ctx, run)

    monkeypatch.setattr(ranks_mod, "track", counted)
    return seen


def _report(views: RankViews, run: str, ranks: int, step: int, now: float, slow: int | None = None) -> None:
    for r in range(ranks):
        views.envelope(Envelope(run_id=run, device=str(r), sent_at=now, rank=r, samples=[Sample(
            run_id=run, device=str(r), step=step, time=now, loss=2.0, local_grad_norm=1.0,
            step_time=0.5 if r == slow else 0.1)]), now)


def test_a_check_passes_over_quiet_runs_and_still_finds_a_straggler(judged: list[str]) -> None:
    cfg = RanksConfig(history=4, straggler_checks=2)
    views = RankViews(cfg.max_runs, cfg.max_ranks, cfg.history)
    now = 1000.0
    for k in range(4):
        for q in range(50):
            _report(views, f"quiet-{q}", 8, k, now)
        now += 1.0
    assert check(views, cfg, now) == [] and len(judged) == 50  # the first check: every run
    events = []
    for k in range(4, 12):
        _report(views, "busy", 8, k, now, slow=3)
        judged.clear()
        events += check(views, cfg, now + 0.5, since=now - 0.5)
        assert judged == ["busy"]  # the 50 quiet runs are not looked at
        now += 1.0
    assert [(e.rule, e.device) for e in events] == [("rank_straggler", "3")]


class _NoScan(OrderedDict):  # type: ignore[type-arg]
    """The views' runs, refusing to be walked: a check that looks at every run kept fails on it."""

    def values(self):  # type: ignore[no-untyped-def]
        raise AssertionError("a check with `since` walked every run kept")

    items = keys = __iter__ = values  # type: ignore[assignment]


def test_a_check_after_the_first_never_walks_every_run_and_still_looks_at_a_quiet_run_with_an_alert(
        judged: list[str]) -> None:
    cfg = RanksConfig(history=4, straggler_checks=2)
    views = RankViews(cfg.max_runs, cfg.max_ranks, cfg.history)
    now = 1000.0
    for q in range(200):
        _report(views, f"quiet-{q}", 8, 0, now)
    assert check(views, cfg, now) == []  # the first check walks them all
    views.runs = _NoScan(views.runs)
    events = []
    for k in range(1, 9):
        now += 1.0
        _report(views, "busy", 8, k, now, slow=3)
        _report(views, f"quiet-{k}", 8, k, now)  # another run that reported
        judged.clear()
        events += check(views, cfg, now + 0.5, since=now - 0.5)
        assert sorted(judged) == ["busy", f"quiet-{k}"]
    assert [(e.rule, e.device, e.status.value) for e in events] == [("rank_straggler", "3", "firing")]
    judged.clear()
    assert check(views, cfg, now + 5.0, since=now + 1.0) == []  # nothing reported: only the run with an alert
    assert judged == ["busy"]
