"""The job's side of commands: what the jobs' polls and posts get, what their answers do, and the
reports that go back to where a command came from. Functions of the shared `BotState`: the ingest path
(bot/ingest/envelope.py) and the HTTP poll route call them; so do the chat edges (bot/chat/slack/inbound.py).

    job's ActionResult (command_id) -> record per device -> report where the command came from
    expiry loop -> a command no job took is closed and the user told

Reports travel through the durable outbox (kind "note"), so a chat outage delays them and loses nothing;
each goes to its command's `Origin`: the receiver named there, with the `ReplyTo` the chat edge made,
carried unread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import msgspec

from bot.commands.origin import Origin
from bot.commands.parse import format_duration
from bot.receivers import Note
from bot.shared import BotState
from bot.store.rows import FINAL, CommandRow, CommandStatus, RunRow
from bot.store.sqlite import OutboxEntry
from msmon.contract.actions import ACTIONS, AUTOMATIC, ParamError, check_params
from msmon.contract.wire import ActionRequest, ActionResult, Command, encode


def poll(state: BotState, run_id: str, device: str, after: int) -> tuple[list[Command], int]:
    """Open commands of `run_id` after cursor `after` that `device` has not answered; the new cursor."""
    cmds, cursor = [], after
    for c in state.store.commands.open_for(run_id, after):
        cursor = max(cursor, int(c["seq"]))
        if device in c["results"]:
            continue
        cmds.append(_wire(c))
    return cmds, cursor


async def long_poll(state: BotState, run_id: str, device: str, after: int, wait: float) -> tuple[list[Command], int]:
    """`poll`, and when nothing is there, again once a command for the run is queued or `wait` seconds
    have passed (a job's long poll)."""
    cmds, cursor = poll(state, run_id, device, after)
    if not cmds and wait > 0:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(state.waiters.event(run_id).wait(), wait)
        cmds, cursor = poll(state, run_id, device, after)
    return cmds, cursor


def _wire(c: CommandRow) -> Command:
    return Command(id=c["id"], run_id=c["run_id"] or "", action=c["action"] or "", params=c["params"],
                   apply_step=c["apply_step"] or 0, issued_by=Origin.from_stored(c["origin"]).user_name or c["user"],
                   issued_at=c["created_at"], expires_at=c["expires_at"] or 0.0)


class RuleRequestError(Exception):
    """A rank's request for a configured action that the bot will not queue: `status` for the HTTP answer;
    `retry`: the job should ask again (409: the run's first report is still on its way), never a 5xx."""

    def __init__(self, status: int, reason: str, retry: bool = False) -> None:
        super().__init__(reason)
        self.status, self.reason, self.retry = status, reason, retry


def rule_request(state: BotState, apply_step: Callable[[RunRow, float], int], req: ActionRequest,
                 project: str) -> tuple[CommandRow, bool]:
    """A configured action that a rule fired on one rank of a multi-rank run (`ActionRequest`), as a command
    every rank of the run applies at the same step, like a chat command (`apply_step`: the command service's).
    Recorded in the commands table (the audit) with source and user "rule R on rank N". While one such
    command for the same action and parameters waits, ranks asking again get it (a NaN on 64 ranks is one
    pause): (the command, whether it is new). RuleRequestError when it cannot be queued."""
    if not state.cfg.commands.enable:
        raise RuleRequestError(403, "commands are switched off on this bot (commands.enable in its bot.yaml), so "
                                    "no configured action can reach the ranks of a multi-rank run")
    if req.action not in AUTOMATIC:
        raise RuleRequestError(422, f"{req.action!r} is not an action a rule may run; those are {', '.join(AUTOMATIC)}")
    req = _check_params(req)
    run = state.store.run(req.run_id)
    if run is None:
        raise RuleRequestError(409, f"run {req.run_id!r} has not reported yet; ask again in a moment", retry=True)
    waiting = state.store.commands.open_for(req.run_id)
    for c in waiting:
        if c["action"] == req.action and c["params"] == req.params and c["source"].startswith("rule "):
            return c, False
    rank = req.rank if req.rank is not None else req.device
    who = f"rule {req.rule} on rank {rank}"
    now = state.clock()
    step = max([apply_step(run, now), *(int(c["apply_step"] or 0) for c in waiting)])
    extra = "".join(f" {k}={v}" for k, v in sorted(req.params.items()))
    text = (f"{ACTIONS[req.action].verb} {req.run_id}{extra} ({req.rule} {req.severity.value} on rank {rank} at step "
            f"{req.step:,})")
    with state.store.tx():
        cmd = state.store.commands.add(
            created_at=now, user=who, source=who, project=project, run_id=req.run_id, text=text,
            verb=ACTIONS[req.action].verb, action=req.action, params=dict(req.params), apply_step=step,
            status=CommandStatus.PENDING, detail="", origin=Origin(source=who, user=who).to_stored(),
            expires_at=now + state.cfg.commands.expire_after)
    state.waiters.wake(req.run_id)
    return cmd, True


def _check_params(req: ActionRequest) -> ActionRequest:
    """The action's own parameters only, each as the action table's kind allows (msmon/contract/actions.py, the
    bounds the job's monitor_config and every rank apply too): every rank is handed them, so a request that would
    fail there is refused here, once, with a 422 that names the key. The parameters as every rank gets them."""
    try:
        params = check_params(req.action, req.params)
    except ParamError as exc:
        raise RuleRequestError(422, str(exc)) from None
    for name in params:
        p = ACTIONS[req.action].param(name)
        if p is not None and not p.rule_key and name not in _JOB_FILLED:
            raise RuleRequestError(422, f"{req.action}'s {name} is not a parameter a rule's request may set")
    return msgspec.structs.replace(req, params=params)


_JOB_FILLED = ("before", "alert", "attempt")  # a rule's rewind: the job fills these in (JobControl.take_event)


LEVEL_ACTIONS = ("set_threshold", "loosen_threshold", "restore_threshold")


def record_level_change(state: BotState, a: ActionResult) -> None:
    """Keep a rank's applied threshold change with its run: who (the command's user, else the job's source), why
    (the command's text, else the source), and the job's detail (old and new levels, the effect on its window)."""
    c = state.store.commands.get(a.command_id) if a.command_id else None
    who = (Origin.from_stored(c["origin"]).user_name or c["user"]) if c else a.source
    state.store.commands.add_level_change(
        run_id=a.run_id, device=a.device, step=a.step, at=a.time, rule=str(a.params.get("rule", "")),
        action=a.action, who=who, why=c["text"] if c else a.source, detail=a.detail, command_id=a.command_id)


def record_results(state: BotState, actions: list[ActionResult]) -> int:
    """Record the jobs' answers to commands (inside the ingest transaction); reports queued. Applied
    threshold changes are kept with the run too, with or without a command (`record_level_change`)."""
    queued = 0
    for a in actions:
        if a.action in LEVEL_ACTIONS and a.ok and a.applied:
            record_level_change(state, a)
        if a.command_id is None:
            queued += _follow_up(state, a)
            continue
        c = state.store.commands.get(a.command_id)
        if c is None or c["run_id"] != a.run_id or c["status"] in FINAL or a.device in c["results"]:
            continue  # unknown, another run's (a job answers only its own), closed, or a repeat
        results = dict(c["results"])
        results[a.device] = {"ok": a.ok, "step": a.step, "detail": a.detail, "path": a.path}
        # Known now, not at the next heartbeat: a pause or resume answer carries the job's paused state
        # (a cancelled or moot pause answers applied=False, paused=False).
        if a.ok and a.paused is not None:  # the job says whether it is paused now
            state.store.set_paused(a.run_id, a.paused, state.clock())
            if a.action == "resume" and a.applied:
                state.resumed_at[a.run_id] = a.time
                if len(state.resumed_at) > state.cfg.max_runs:
                    state.resumed_at.pop(next(iter(state.resumed_at)))
        run = state.store.run(c["run_id"])
        devices = set(run["devices"]) if run else {a.device}
        done = devices <= set(results)
        status = (CommandStatus.DONE if all(r["ok"] for r in results.values()) else CommandStatus.FAILED) if done \
            else CommandStatus.PENDING
        now = state.clock()
        state.store.commands.update(c["id"], now, results=results, status=status,
                                   detail=_summary(results) if done else c["detail"])
        if done or not a.ok:
            _note(state, c, _report(c, results, done))
            queued += 1
    return queued


FOLLOW_UP_MEMORY = 30 * 86400  # seconds a rewind's follow-up is remembered as reported


def _follow_up(state: BotState, a: ActionResult) -> int:
    """A rewind's follow-up (the loss some steps after it against the pre-fault curve, docs/rewind.md): reported
    where the rewind command came from, once per command (the first rank's; the others train the same run). Once
    is kept in the store (the table that keeps a signed chat request to once), so a restart or another replica
    does not report it again."""
    cid = a.params.get("follow_up") if a.action == "rewind" else None
    if not isinstance(cid, str):
        return 0
    c = state.store.commands.get(cid)
    if c is None or c["run_id"] != a.run_id:
        return 0
    now = state.clock()
    if not state.store.commands.first_signed(f"follow-up|{cid}", int(now + FOLLOW_UP_MEMORY), now):
        return 0
    _note(state, c, f"{c['id']} `{c['text']}`, follow-up (device {a.device}): {a.detail}")
    return 1


def expire(state: BotState) -> int:
    """Close the commands no job answered in time, and tell whoever sent them."""
    now = state.clock()
    n = 0
    with state.store.tx():
        for c in state.store.commands.open_all():
            if c["expires_at"] is None or c["expires_at"] > now:
                continue
            results = c["results"]
            status = CommandStatus.PARTIAL if results else CommandStatus.EXPIRED
            after = format_duration(float(state.cfg.commands.expire_after))
            if results:
                text = (f"{c['id']} `{c['text']}`: only {len(results)} rank(s) answered within {after}: "
                        f"{_summary(results)}")
            else:
                text = (f"{c['id']} `{c['text']}` expired: no job picked it up within {after}. Is run "
                        f"{c['run_id']} still running, with bot.commands on and a MonitorCallback?")
            state.store.commands.update(c["id"], now, status=status, detail=text)
            _note(state, c, text)
            n += 1
    if n:
        state.wake_outbox()
    return n


def _note(state: BotState, c: CommandRow, text: str) -> None:
    """Queue a report for where command `c` came from."""
    note(state, Origin.from_stored(c["origin"]), text, c["run_id"], c["id"])


def note(state: BotState, origin: Origin, text: str, run_id: str | None = None, command_id: str | None = None,
         chart: bytes | None = None, private: bool = False) -> None:
    """Queue a report in chat for `origin` (through the durable outbox): to its receiver, the row's
    channel that of its ReplyTo (so the report shares that conversation's rate limit and pacing)."""
    note = Note(text=text, reply_to=origin.reply_to, command_id=command_id, chart=chart, private=private)
    now = state.clock()
    state.store.enqueue_many([OutboxEntry(now, origin.receiver, origin.reply_to.channel, "note",
                                          f"note|{command_id}|{now!r}", run_id, encode(note).decode(), now)])
    state.wake_outbox()


def _summary(results: dict[str, dict[str, Any]]) -> str:
    parts = []
    for dev, r in sorted(results.items()):
        parts.append(f"device {dev} {'OK' if r['ok'] else 'FAILED'} at step {r['step']:,}: {r['detail']}")
    return "; ".join(parts)


def _report(c: CommandRow, results: dict[str, dict[str, Any]], done: bool) -> str:
    head = f"{c['id']} `{c['text']}` (from {Origin.from_stored(c['origin']).who})"
    if not done:
        return f"{head}: a rank failed: {_summary(results)}"
    return f"{head}: {_summary(results)}"
