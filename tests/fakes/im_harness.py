"""The real bot's ingest, pipeline, SQLite outbox and delivery worker on an injected clock, with one of
the Feishu/DingTalk/WeCom receivers pointed at its local robot server: `ImBot.ingest` takes events as a
job sends them, `ImBot.drain` runs the outbox's rounds while the clock moves (no sleeping, no threads)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from bot.app import INGEST, OUTBOX, STORE, create_app
from bot.config import load_bot_config
from bot.pipeline.schedule import Policy
from bot.receivers import Message, Receiver
from bot.receivers.console import ConsoleReceiver
from msmon.contract.wire import Envelope, Event, Status

T0 = 1_700_000_000.0


@dataclasses.dataclass
class Clock:
    t: float = T0

    def __call__(self) -> float:
        return self.t


class ImBot:
    def __init__(self, tmp_path: Any, receiver: Receiver, clock: Clock, charts: bool = False,
                 policy: Policy | None = None) -> None:
        cfg = load_bot_config({"bot": {
            "state_path": str(tmp_path / "bot.sqlite"),
            "routes": [{"receiver": receiver.name, "channel": "oncall"}],
            "pipeline": {"group_wait": 0.0},
            "rate_limit": {"per_channel": 1000, "per_run": 1000, "global_rate": 1000, "burst": 1000},
            "console": {"charts_dir": str(tmp_path / "charts"), "charts": charts}}})
        self.clock = clock
        self.app = create_app(cfg, clock=clock, delivery=policy or Policy(base=0.5, cap=20.0),
                              receivers={"console": ConsoleReceiver(None), receiver.name: receiver})

    def ingest(self, events: list[Event], project: str = "llm") -> None:
        self.app[INGEST].envelope(Envelope(run_id=events[0].run_id, device="0", sent_at=self.clock(),
                                           project=project, events=events))

    async def drain(self, until: float, step: float = 0.5, each: Callable[[], None] | None = None) -> None:
        """Outbox rounds every `step` seconds of the clock until `until` (or until nothing is left)."""
        while self.clock.t < until:
            if each is not None:
                each()
            await self.app[OUTBOX].deliver_due()
            if each is None and self.depth() == 0:
                return
            self.clock.t += step

    def depth(self) -> int:
        return self.app[STORE].depth()

    def dead(self) -> int:
        return self.app[STORE].dead_count()

    def close(self) -> None:
        self.app[STORE].close()


def message(e: Event) -> Message:
    """A firing alert of one event, as the outbox hands it to a receiver."""
    return Message(key="k", run_id=e.run_id, project="llm", rule=e.rule, severity=e.severity, status=Status.FIRING,
                   events=[e])
