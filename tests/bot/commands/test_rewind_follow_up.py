"""A rewind's follow-up (the loss after report_after steps against the pre-fault curve, notifier/control.py) goes
where the rewind command came from, once, whichever ranks send it (bot/commands/jobs.py record_results)."""

from __future__ import annotations

from bot.commands.jobs import record_results
from bot.commands.origin import Origin
from bot.config import load_bot_config
from bot.metrics import BotMetrics
from bot.shared import BotState
from bot.store.sqlite import Store
from msmon.contract.wire import ActionResult


def test_the_follow_up_is_reported_once_where_the_rewind_came_from(tmp_path) -> None:  # noqa: ANN001
    cfg = load_bot_config({"bot": {"port": 0, "state_path": str(tmp_path / "s.sqlite")}})
    state = BotState(cfg, Store(cfg.state_path), BotMetrics(), lambda: 1000.0)
    with state.store.tx():
        state.store.touch_run("r1", "default", {}, "0", 300, 1000.0, heartbeat=True)
        cmd = state.store.commands.add(
            created_at=1000.0, user="cli:ops", source="cli", project="default", run_id="r1",
            text="rewind r1 before-alert skip 100", verb="rewind", action="rewind", params={"before": -1, "skip": 100},
            apply_step=301, status="pending", detail="", origin=Origin(source="cli", user="cli:ops").to_stored(),
            expires_at=2000.0)
    follow = [ActionResult(run_id="r1", device=d, step=350, time=1000.0, action="rewind", ok=True,
                           detail="100 steps after the rewind to step 250: loss 0.24 ...: back on the pre-fault curve",
                           params={"from": 302, "to": 250, "follow_up": cmd["id"]}, source="follow-up")
              for d in ("0", "1")]
    with state.store.tx():
        assert record_results(state, follow) == 1
    with state.store.tx():
        assert record_results(state, follow[:1]) == 0
    rows = state.store.due(1e9)
    assert any("follow-up (device 0)" in r.payload and "back on the pre-fault curve" in r.payload
               for r in rows), rows
    other = ActionResult(run_id="r2", device="0", step=1, time=1.0, action="rewind", ok=True, detail="x",
                         params={"follow_up": "c999"})
    with state.store.tx():
        assert record_results(state, [other]) == 0
