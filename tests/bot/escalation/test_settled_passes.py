"""The escalator's pass passes over escalations that nothing changed for and nothing fell due (no claim, no read
of their event), and still takes every step on time and closes what was acknowledged. A real SQLite store, an
injected clock."""

from __future__ import annotations

from bot.config import load_bot_config
from bot.escalation.scheduler import Escalator
from bot.metrics import BotMetrics
from bot.shared import BotState
from bot.store.sqlite import AlertRow, Store
from msmon.contract.wire import encode
from tests.fakes.records import event


def test_a_pass_looks_only_at_what_changed_or_fell_due(tmp_path):
    now = [1_000_000.0]
    cfg = load_bot_config({"bot": {
        "state_path": str(tmp_path / "esc.sqlite"),
        "escalations": {"page": {"levels": [{"after": 60, "mention": ["@a"]}, {"after": 300, "mention": ["@b"]}]}},
        "routes": [{"receiver": "console", "channel": "c", "escalation": "page"}]}})
    state = BotState(cfg, Store(cfg.state_path), BotMetrics(), lambda: now[0])
    store = state.store
    with store.tx():
        for r in range(20):
            store.touch_run(f"run-{r}", "p", {}, "0", 5, now[0])
        store.save_alerts([AlertRow(f"run-{r}|loss|0", f"run-{r}", "loss", "0", "ERROR", "firing", 5, now[0],
                                    event=encode(event(run=f"run-{r}", rule="loss")).decode()) for r in range(20)])
    esc = Escalator(state, clock=lambda: now[0])
    claims: list[int] = []
    claim = store.escalations.claim

    def counted(esc_id, owner, t, lease):  # type: ignore[no-untyped-def]
        claims.append(esc_id)
        return claim(esc_id, owner, t, lease)

    store.escalations.claim = counted  # type: ignore[method-assign]
    assert esc.sync() == 0 and len(store.escalations.open()) == 20 and len(claims) == 20  # started, first look
    for _ in range(5):
        now[0] += 1.0
        claims.clear()
        assert esc.sync() == 0
        assert claims == []  # nothing changed, nothing due: not one escalation claimed
    now[0] += 60.0
    assert esc.sync() == 20 and len(claims) == 20  # the first level fell due for all of them: on time
    claims.clear()
    with store.tx():  # one alert acknowledged
        store.db.execute("UPDATE alerts SET acked_by='alice' WHERE run_id='run-3'")
    now[0] += 1.0
    assert esc.sync() == 0 and len(claims) == 1  # only that one looked at, and closed
    assert len(store.escalations.open()) == 19
    now[0] += 300.0
    claims.clear()
    assert esc.sync() == 19 and len(claims) == 19  # the second level for the others
