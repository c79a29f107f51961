"""The view across a run's ranks and the rules that compare them, declared here in order.

    ranks' envelopes ─► RankViews (view.py: latest per rank, spread) ─► every `ranks.period` s:
        each run ─► RULES, each `Rule(name, judge, level, hint)` (rule.py) ─► track: streaks, severities
                 ─► wire Events (firing / resolved) ─► bot/ingest/envelope.py's STAGES like any job's event

Pure and clock-injected like bot/pipeline: the view is fed by the ingest, the time arrives in the
`Check`, and the events leave through `watch.RankWatch`, the edge that bot/assembly.py runs on its periodic
task. Nothing is asked of the job: no collective, no extra work in its step; the ranks' own reports
(samples, heartbeats) are aggregated here. A storm (one rule on many ranks) is one message: the events
share a group key (bot/pipeline/group.py) and the message says how many of the run's ranks (render.py).
"""

from __future__ import annotations

from bot.config import RanksConfig
from bot.ranks import missing, outlier, skew, straggler
from bot.ranks.rule import Check, Finding, Rule, error_at_once, track, warning_after, warning_then_error
from bot.ranks.view import RankState, RankViews, RunRanks
from msmon.contract.wire import Event

HINTS = {
    "rank_straggler": "One rank holds every other back at each collective. Look at that host: thermal throttling, "
                      "a noisy neighbour, a slow data loader or disk on that rank (py-spy dump it); drain the node "
                      "if it persists.",
    "rank_outlier": "One rank's numbers leave the others': a bad data shard, or a failing card computing wrong "
                    "values. Check that rank's input files and its device's health (ECC errors) before the "
                    "reduced gradient spreads it.",
    "rank_missing": "That rank's process died or hangs while the others wait for it in the next collective. Check "
                    "its log and node; the job will not progress until it is restarted from a checkpoint.",
    "step_skew": "Ranks disagree on the step: one was restarted or is held back. Compare the ranks' logs; a "
                 "data-parallel job must step together.",
}

RULES: tuple[Rule, ...] = (
    Rule("rank_missing", missing.judge, error_at_once, HINTS["rank_missing"]),  # silent while the others go on
    Rule("rank_straggler", straggler.judge, warning_after(lambda c: c.straggler_checks),
         HINTS["rank_straggler"], fresh=True),  # behind the others' pace, sustained
    Rule("rank_outlier", outlier.judge,
         warning_then_error(lambda c: c.outlier_checks, lambda c: c.outlier_error_checks),
         HINTS["rank_outlier"], fresh=True),  # loss / grad norm away from the others
    Rule("step_skew", skew.judge, warning_after(lambda c: c.skew_checks), HINTS["step_skew"]),
)


def check(views: RankViews, settings: RanksConfig, now: float, since: float | None = None) -> list[Event]:
    """One check of the runs' ranks: the events to raise (usually none). With `since` (the previous check), only
    the runs heard from since then and those with an alert firing: a run none of whose ranks said anything has
    nothing new to compare (a rank missing is one silent while the others go on; a whole job gone silent is the
    watchdog's job_gone), so a check costs the runs that reported, not every run kept."""
    ctx = Check(now, settings)
    out: list[Event] = []
    if since is None:
        runs = list(views.runs.values())
    else:  # in the views' order (the least recently seen first), as a check of every run takes them
        ids = views.heard_ids | views.alerting
        runs = sorted((r for r in map(views.runs.get, ids) if r is not None), key=lambda r: (r.heard, r.run_id))
    views.heard_ids.clear()
    for run in runs:
        if since is not None and run.heard < since and not run.firing and not ending(run):
            continue
        if len(run.members) >= settings.min_ranks or run.firing:
            out += track(RULES, ctx, run)
        if run.firing or ending(run):  # an ending run is looked at until its last ranks end or are missing
            views.alerting.add(run.run_id)
        else:
            views.alerting.discard(run.run_id)
    return out


def ending(run: RunRanks) -> bool:
    """Some of the run's ranks said final and some neither did nor are missing: a rank killed just before the
    others finished is found missing only by a later check (bot/runs/lifecycle.py's `tick`)."""
    members = run.members.values()
    return any(m.ended for m in members) and any(not m.ended and not m.missing for m in members)


def marks(run: RunRanks, settings: RanksConfig, now: float) -> dict[str, list[Finding]]:
    """Which ranks the rules find something about now (no streak moved): for `status`'s table."""
    ctx = Check(now, settings)
    out: dict[str, list[Finding]] = {}
    for rule in RULES:
        for f in rule.judge(ctx, run):
            out.setdefault(f.member.key, []).append(f)
    return out


__all__ = ["RULES", "Check", "Finding", "RankState", "RankViews", "Rule", "RunRanks", "check", "marks"]
