"""`status <run>`'s table of ranks: every rank of a small run; for a large one the ranks a rule finds
something about now, then one summary line (never 512 rows in a chat message). Job data (hosts) is
returned as is: the chat receiver escapes the text it sends."""

from __future__ import annotations

from collections import Counter

from bot.config import RanksConfig
from bot.ranks import marks
from bot.ranks.stats import Spread
from bot.ranks.view import RankState, RunRanks

SHOWN = 16  # rows at most; a run with more ranks shows its marked ones and the summary


def _num(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}{unit}" if abs(x) >= 1e4 else f"{x:.4g}{unit}"


def _row(m: RankState, mark: str) -> str:
    rank = str(m.rank) if m.rank is not None else m.device
    tp = m.tokens_per_s if m.tokens_per_s is not None else m.samples_per_s
    return (f"{'!' if mark else ' '} {rank:>5} {m.host or '-':<14.14} {m.step if m.step is not None else '-':>9} "
            f"{_num(m.loss):>9} {_num(m.norm()):>9} {_num(tp):>9} {_num(m.step_time, ' s'):>9}"
            f"{'  ' + mark if mark else ''}")


def _summary(name: str, s: Spread | None, unit: str = "") -> str | None:
    if s is None:
        return None
    return f"{name} median {s.median:.4g}{unit} (MAD sigma {s.sigma:.3g}, {s.low:.4g} to {s.high:.4g})"


def lines(run: RunRanks, settings: RanksConfig, now: float) -> list[str]:
    """The table's lines (empty for a run of one rank): header, rows (the marked first), summary."""
    members = list(run.members.values())
    if len(members) < 2:
        return []
    why: dict[str, set[str]] = {}
    for key, fs in marks(run, settings, now).items():  # what is off now
        why.setdefault(key, set()).update(f.metric for f in fs)
    for (rule, key), st in run.firing.items():  # and what is firing
        if st.severity is not None:
            why.setdefault(key, set()).add(rule)
    mark = {k: ", ".join(sorted(v)) for k, v in why.items()}
    ordered = sorted(members, key=lambda m: (m.key not in mark, m.rank if m.rank is not None else 1 << 40, m.key))
    rows = ordered if len(members) <= SHOWN else [m for m in ordered if m.key in mark][:SHOWN]
    phases = Counter(m.life.phase.value for m in members)  # the rank lifecycle (bot/runs/lifecycle.py)
    out = [f"ranks: {len(members)} known, {len(run.live())} live, {len(mark)} marked (!); "
           f"{', '.join(f'{n} {p}' for p, n in sorted(phases.items()))}"
           + (f", {run.refused} samples of ranks past ranks.max_ranks not kept" if run.refused else ""),
           "```", "  rank  host                step      loss  gradnorm   tput/s  step time"]
    out += [_row(m, mark.get(m.key, "")) for m in rows]
    out.append("```")
    if len(members) > len(rows):
        out.append(f"({len(members) - len(rows)} unmarked ranks not shown)")
    steps = run.spread("step")
    if steps is not None:
        out.append(f"steps {steps.low:,.0f} to {steps.high:,.0f} (skew {steps.high - steps.low:,.0f})")
    for line in (_summary("loss", run.spread("loss")), _summary("own grad norm", run.spread("norm")),
                 _summary("step time", run.spread("step_time"), " s")):
        if line:
            out.append(line)
    mean = run.mean_local_norm()
    reduced = run.spread("grad_norm")
    if mean is not None or reduced is not None:
        out.append(f"grad norm: mean of the ranks' own {_num(mean)}, of the reduced gradient "
                   f"{_num(reduced.median if reduced else None)}")
    return out
