"""A rewind's follow-up (the loss after report_after steps against the pre-fault curve, notifier/control/rewind.py) goes
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


def test_once_is_kept_per_store_not_per_process(tmp_path) -> None:  # noqa: ANN001
    """Two bots in one process each report their own c1's follow-up; a bot restarted on the same store does not
    report it again."""

    def bot(path: str) -> tuple[BotState, str]:
        cfg = load_bot_config({"bot": {"port": 0, "state_path": path}})
        state = BotState(cfg, Store(cfg.state_path), BotMetrics(), lambda: 1000.0)
        if state.store.commands.get("c1") is None:
            with state.store.tx():
                state.store.touch_run("r1", "default", {}, "0", 300, 1000.0, heartbeat=True)
                state.store.commands.add(
                    created_at=1000.0, user="cli:ops", source="cli", project="default", run_id="r1", text="rewind r1",
                    verb="rewind", action="rewind", params={}, apply_step=301, status="done", detail="",
                    origin=Origin(source="cli", user="cli:ops").to_stored(), expires_at=2000.0)
        return state, "c1"

    def follow(cid: str) -> list[ActionResult]:
        return [ActionResult(run_id="r1", device="0", step=350, time=1000.0, action="rewind", ok=True, detail="ok",
                             params={"follow_up": cid}, source="follow-up")]

    a, cid = bot(str(tmp_path / "a.sqlite"))
    b, _ = bot(str(tmp_path / "b.sqlite"))
    with a.store.tx():
        assert record_results(a, follow(cid)) == 1
    with b.store.tx():
        assert record_results(b, follow(cid)) == 1  # another bot's c1: its own follow-up
    a.store.close()
    again, _ = bot(str(tmp_path / "a.sqlite"))
    with again.store.tx():
        assert record_results(again, follow(cid)) == 0  # after a restart: already reported
