"""Jobs that keep the books of what the bot accepted: many runs' envelopes (samples, events, heartbeats in them)
and standalone heartbeats sent to a real bot from several threads in a seeded random order, every answer that
is not a 202 sent again as the job's transport does, and what each 202 said it took recorded. `lost()` then
reads the store itself and names every 202'd step, device and alert that is not there: a 202 means stored.

Used by tests/bot/store/test_accepted_is_stored.py under faults (a resetting, refusing, blackholing
PostgreSQL; a locked or full SQLite file).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bot.pipeline.alert import fingerprint
from msmon.contract.wire import Envelope, Heartbeat, Sample, Severity, encode
from tests.fakes.bot_server import BotServer
from tests.fakes.records import event

RULES = ("grad_norm", "loss_spike", "nan_loss")
KINDS = (("samples", 60), ("event", 12), ("heartbeat", 16), ("envelope_heartbeat", 12))


@dataclass
class Books:
    """What the bot answered 202 for: per run its highest step and its devices; per alert its run, rule, device."""

    steps: dict[str, int] = field(default_factory=dict)
    devices: dict[str, set[str]] = field(default_factory=dict)
    alerts: set[tuple[str, str, str]] = field(default_factory=set)
    accepted: int = 0  # requests answered 202
    retried: int = 0  # answers that were not a 202 (503 while the store is away), each sent again
    odd: list[tuple[int, Any]] = field(default_factory=list)  # answers neither 202 nor 503: a bug
    lock: threading.Lock = field(default_factory=threading.Lock)

    def took(self, run: str, device: str, step: int, alert: str | None) -> None:
        with self.lock:
            self.accepted += 1
            self.steps[run] = max(self.steps.get(run, -1), step)
            self.devices.setdefault(run, set()).add(device)
            if alert is not None:
                self.alerts.add((run, alert, device))


def _request(rng: random.Random, run: str, step: int) -> tuple[str, bytes, str, str | None]:
    """(path, body, device, the alert's rule or None) of one random request of `run` at `step`."""
    kinds, weights = zip(*KINDS, strict=True)
    kind = rng.choices(kinds, weights)[0]
    device = str(rng.randrange(4))
    now = time.time()
    if kind == "heartbeat":
        return "/v1/heartbeat", encode(Heartbeat(run_id=run, device=device, step=step, time=now, project="llm")), \
            device, None
    env = Envelope(run_id=run, device=device, sent_at=now, project="llm")
    rule = None
    if kind == "samples":
        env.samples = [Sample(run_id=run, device=device, step=s, time=now, loss=2.0) for s in (step - 1, step)]
    elif kind == "event":
        rule = rng.choice(RULES)
        env.events = [msg_event(run, rule, device, step, rng)]
    else:
        env.heartbeats = [Heartbeat(run_id=run, device=device, step=step, time=now, project="llm")]
    return "/v1/ingest", encode(env), device, rule


def msg_event(run: str, rule: str, device: str, step: int, rng: random.Random) -> Any:
    import msgspec

    ev = event(run=run, rule=rule, device=device, step=step,
               sev=rng.choice([Severity.ERROR, Severity.WARNING]))
    return msgspec.structs.replace(ev, window=None) if rng.random() < 0.5 else ev


def drive(bot: BotServer, seed: int, runs: int, requests: int, workers: int = 6, prefix: str = "r",
          books: Books | None = None, keep_going: Callable[[], bool] = lambda: True,
          give_up_after: float = 60.0) -> Books:
    """`requests` requests from `runs` runs (each run's requests in order, from one worker; its steps rising by
    1-5), spread over `workers` threads; every non-202 sent again until it is a 202 (or `give_up_after`
    seconds of trying fail the test). The books of every 202."""
    books = books or Books()
    names = [f"{prefix}{seed}-{i:03d}" for i in range(runs)]
    errors: list[BaseException] = []

    def work(w: int) -> None:
        rng = random.Random(seed * 1000 + w)
        mine = names[w::workers]
        step = dict.fromkeys(mine, 0)
        try:
            for _ in range(requests // workers):
                if not keep_going():
                    return
                run = rng.choice(mine)
                step[run] += rng.randint(1, 5)
                path, body, device, rule = _request(rng, run, step[run])
                t0 = time.monotonic()
                while True:
                    try:
                        status, answer = bot.request("POST", path, body)
                    except OSError as exc:  # the bot's loop held past the client's timeout: sent again
                        status, answer = 0, str(exc)
                    if status == 202:
                        books.took(run, device, step[run], rule)
                        break
                    with books.lock:
                        books.retried += 1
                        if status not in (0, 503):
                            books.odd.append((status, answer))
                    assert time.monotonic() - t0 < give_up_after, f"no 202 for {path} in {give_up_after} s: {answer}"
                    time.sleep(0.02)  # the job's backoff before it sends again (not a wait for a condition)
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,), name=f"job-{w}") for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return books


def lost(books: Books, rows: dict[str, tuple[int | None, list[str]]], alert_fps: set[str]) -> list[str]:
    """What was answered 202 and is not in the store: `rows` is run -> (last_step, devices) as read from the
    store, `alert_fps` the alerts' fingerprints there."""
    out = []
    for run, step in books.steps.items():
        last, devices = rows.get(run, (None, []))
        if last is None or last < step:
            out.append(f"{run}: last_step {last} < {step} answered 202")
        missing = books.devices[run] - set(devices)
        if missing:
            out.append(f"{run}: devices {sorted(missing)} answered 202, not in runs.devices {devices}")
    for run, rule, device in books.alerts:
        if fingerprint(run, rule, device) not in alert_fps:
            out.append(f"{run}: alert {rule} on device {device} answered 202, no alert row")
    return out
