"""What the Feishu/Lark, DingTalk and WeCom webhook receivers share: their signatures, a sliding-window
send budget per robot (the platforms' documented rates), and one JSON POST that turns every answer
into a result or a DeliveryError.

The budget is pure (an injected clock): a receiver asks `wait(now)` before a post and, when a robot's
window is full, raises DeliveryError with that many seconds as Retry-After, so the outbox paces that
lane alone and keeps the rows (nothing is lost, nothing is sent into the platform's throttle).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import logging
import math
import os
import urllib.parse
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiohttp

from bot.charts.links import ChartLinks
from bot.receivers import DeliveryError, Held, Message, Note, retry_after
from bot.receivers.render import Escape, escape_plain_im, num, text, title

log = logging.getLogger("msmon.bot")


def feishu_sign(timestamp: int, secret: str) -> str:
    """Feishu/Lark custom bot: HMAC-SHA256 keyed with `timestamp + "\\n" + secret` over an empty message,
    base64 (timestamp in seconds, within an hour of Feishu's clock)."""
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def dingtalk_sign(timestamp_ms: int, secret: str) -> str:
    """DingTalk custom robot: HMAC-SHA256 keyed with the secret over `timestamp + "\\n" + secret`, base64,
    then URL-encoded (timestamp in milliseconds, within an hour of DingTalk's clock)."""
    mac = hmac.new(secret.encode(), f"{timestamp_ms}\n{secret}".encode(), hashlib.sha256).digest()
    return urllib.parse.quote_plus(base64.b64encode(mac).decode())


def signed_dingtalk_url(webhook: str, secret: str, timestamp_ms: int) -> str:
    """The webhook with `&timestamp=...&sign=...` appended, as DingTalk's signed mode asks."""
    sep = "&" if "?" in webhook else "?"
    return f"{webhook}{sep}timestamp={timestamp_ms}&sign={dingtalk_sign(timestamp_ms, secret)}"


class Budget:
    """Sliding windows of sends (e.g. 100 a minute and 5 a second): `wait` says how long until one more
    is within all of them, `take` records a send. Bounded by the largest window's count."""

    def __init__(self, limits: tuple[tuple[int, float], ...]) -> None:
        self.limits = limits
        self._sent: deque[float] = deque(maxlen=max(n for n, _ in limits))

    def wait(self, now: float) -> float:
        delay = 0.0
        for count, window in self.limits:
            recent = [t for t in self._sent if t > now - window]
            if len(recent) >= count:
                delay = max(delay, recent[-count] + window - now)
        return delay

    def take(self, now: float) -> None:
        self._sent.append(now)

    def recent(self, now: float) -> int:
        """Sends within the largest window."""
        window = max(w for _, w in self.limits)
        return sum(1 for t in self._sent if t > now - window)


def fit_bytes(value: str, limit: int, tail: str = " …") -> str:
    """`value` cut so that its UTF-8 form is at most `limit` bytes (never inside a character)."""
    raw = value.encode()
    if len(raw) <= limit:
        return value
    return raw[: max(0, limit - len(tail.encode()))].decode("utf-8", "ignore") + tail


class WebhookPoster:
    """One JSON POST to a robot's webhook with its budget: the answer's code (`code_key`: Feishu's
    `code`, DingTalk's and WeCom's `errcode`) 0 is success; a throttling code, an HTTP 429 or 5xx and a
    dropped connection are DeliveryErrors with Retry-After where known."""

    def __init__(self, platform: str, budget: Budget, clock: Callable[[], float], code_key: str,
                 throttled: Mapping[int, float], timeout: float = 10.0,
                 permanent: Mapping[int, str] | None = None) -> None:
        self.platform, self.budget, self.clock, self.code_key = platform, budget, clock, code_key
        self.throttled = throttled  # platform code -> seconds to wait (its documented throttle)
        self.permanent = permanent or {}  # platform code -> what to fix: a retry cannot succeed (a dead letter at once)
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def post(self, url: str, body: Mapping[str, Any], what: str) -> dict[str, Any]:
        now = self.clock()
        wait = self.budget.wait(now)
        if wait > 0:
            raise DeliveryError(f"{self.platform} {what} held: the robot's rate limit is used up for "
                                f"{wait:.1f} s more", wait)
        self.budget.take(now)
        data = json.dumps(body, ensure_ascii=False).encode()
        try:
            async with self.session().post(url, data=data, headers={"Content-Type": "application/json"}) as resp:
                raw = await resp.read()
                status, retry = resp.status, resp.headers.get("Retry-After")
        except Exception as exc:  # noqa: BLE001 - aiohttp errors, timeouts: all a failed delivery
            raise DeliveryError(f"{self.platform} {what} failed: {type(exc).__name__}: {exc}") from None
        return self.answer(what, status, retry, raw)

    def answer(self, what: str, status: int, retry: str | None, raw: bytes) -> dict[str, Any]:
        """The platform's JSON answer when it says success (code 0); else a DeliveryError that names it."""
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            shown = " ".join(raw.decode("utf-8", "replace").split())[:200] or "(empty body)"
            raise DeliveryError(f"{self.platform} {what} answered HTTP {status}: {shown}", retry_after(retry))
        code = answer.get(self.code_key, answer.get("StatusCode", 0 if status == 200 else status))
        if status == 200 and code == 0:
            return answer
        reason = answer.get("msg") or answer.get("errmsg") or answer.get("StatusMessage") or ""
        wait = retry_after(retry) or (self.throttled.get(code) if isinstance(code, int) else None)
        fix = self.permanent.get(code) if isinstance(code, int) and wait is None else None
        raise DeliveryError(f"{self.platform} {what} refused: HTTP {status}, code {code}: {str(reason)[:200]}"
                            + (f" (permanent: {fix})" if fix else ""), wait, permanent=fix is not None)


def fit_body(build: Callable[[str], dict[str, Any]], text: str, limit: int) -> dict[str, Any]:
    """The body `build(text)` makes, with `text` cut until the whole JSON body is at most `limit` bytes
    (a platform's body limit: Feishu's 20 KB)."""
    body = build(text)
    for _ in range(16):
        size = len(json.dumps(body, ensure_ascii=False).encode())
        if size <= limit:
            break
        text = fit_bytes(text, max(0, len(text.encode()) - (size - limit) - 64))
        body = build(text)
    return body




@dataclasses.dataclass(frozen=True)
class Pace:
    """How a robot's budget is split: `direct` messages in its window go out one by one; past that,
    messages are held and go out together, as one summary at most every `spacing` seconds (so that
    direct + summaries stay within the platform's limit and its throttle never starts)."""

    direct: int
    spacing: float


@dataclasses.dataclass(frozen=True)
class Send:
    """Send this message now."""


@dataclasses.dataclass(frozen=True)
class Summarise:
    """Send one summary of these held items (id -> line), this message's among them."""

    items: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Hold:
    """Held for the next summary: come back later (the outbox retries the row)."""

    wait: float


@dataclasses.dataclass(frozen=True)
class Done:
    """Already out, in the summary `ref`."""

    ref: str


class Batcher:
    """Pure: per message (an id and its one-line form), send it, hold it, or send the summary of all
    held. Ids already summarised answer Done, so the outbox's retry of a held row settles it without a
    post. Held items live in memory; their rows stay in the outbox until Done, so a restart re-holds
    them (a summary may then repeat, nothing is lost)."""

    def __init__(self, budget: Budget, pace: Pace, max_done: int = 10_000) -> None:
        self.budget, self.pace, self.max_done = budget, pace, max_done
        self.held: OrderedDict[str, str] = OrderedDict()
        self.done: OrderedDict[str, str] = OrderedDict()
        self._last_summary = -math.inf

    def decide(self, item: str, line: str, now: float) -> Send | Summarise | Hold | Done:
        if item in self.done:
            return Done(self.done[item])
        free = self.budget.wait(now)
        if set(self.held) <= {item} and free == 0.0 and self.budget.recent(now) < self.pace.direct:
            self.held.pop(item, None)  # held alone, and there is room again: it goes as itself
            return Send()
        self.held[item] = line
        spacing = self._last_summary + self.pace.spacing - now
        if free == 0.0 and spacing <= 0.0:
            return Summarise(dict(self.held))
        return Hold(max(free, spacing, 0.0))

    def summarised(self, items: Iterable[str], ref: str, now: float) -> None:
        """`items` went out in the summary `ref` at `now`."""
        self._last_summary = now
        for item in items:
            self.held.pop(item, None)
            self.done[item] = ref
        while len(self.done) > self.max_done:
            self.done.popitem(last=False)


class ChatWebhookReceiver:
    """A group robot that can only post (custom bots cannot edit or thread): `post`, `update` and
    `reply` each send one message, `note` a command's result. Within the robot's budget each goes out
    alone; past `pace.direct` in the window, messages are held and summarised (Batcher), so a storm of
    alerts costs a few posts and loses none. A subclass renders its platform's markdown message
    (`markdown_body`), says whether a body fits its limits (`fits`), signs its URL and may send the chart."""

    name = "webhook"
    charts = False
    self_paced = True  # its budget and summaries keep the platform's rate: the bot's token buckets do not apply
    body_limit = 20 * 1024
    limit_text = ""  # the platform's documented rate, for the summary's first line

    def __init__(self, url: str, poster: WebhookPoster, pace: Pace, links: ChartLinks | None = None) -> None:
        self.url, self.poster, self.links = url, poster, links
        self.batcher = Batcher(poster.budget, pace)
        self.charts = self.charts or links is not None
        self._sent = 0

    def signed_url(self) -> str:
        return self.url

    async def close(self) -> None:
        await self.poster.close()

    def markdown_body(self, head: str, text: str, msg: Message | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def escape(self, value: str) -> str:
        raise NotImplementedError

    def fits(self, body: Mapping[str, Any]) -> bool:
        return len(json.dumps(body, ensure_ascii=False).encode()) <= self.body_limit

    def alert_body(self, msg: Message) -> dict[str, Any]:
        head = escape_plain_im(title(msg))[:100]
        return fit_body(lambda t: self.markdown_body(head, t, msg), markdown_text(msg, self.escape), self.body_limit)

    def has_room(self) -> bool:
        """Whether the robot's window has room for one more message alone and nothing waits for a summary
        (a chart: it cannot be summarised, so in a storm the text goes and the chart does not: a chart
        posted then would take the place of the summary that shows the held alerts)."""
        now = self.poster.clock()
        return not self.batcher.held and self.poster.budget.wait(now) == 0.0 and \
            self.poster.budget.recent(now) < self.batcher.pace.direct

    def chart_link(self, msg: Message) -> str | None:
        """The signed, expiring link to `msg`'s chart (bot/charts/links.py) for a robot that cannot upload an
        image, when there is a chart, links are configured and the robot has room for one more message."""
        if msg.chart is None or self.links is None or not self.has_room():
            return None
        return self.links.publish(msg.chart)

    def note_url(self, note: Note) -> str | None:
        """Where a note goes instead of the robot's webhook (DingTalk: the conversation's sessionWebhook)."""
        return None

    async def _send(self, body: Mapping[str, Any], what: str, url: str | None = None) -> str:
        await self.poster.post(url or self.signed_url(), body, what)
        self._sent += 1
        return f"{self.name}-{self._sent}"

    async def _paced(self, item: str, line: str, body: Mapping[str, Any], what: str, url: str | None = None) -> str:
        """Send `body`, or hold it for a summary, or send the summary it belongs to."""
        now = self.poster.clock()
        decision = self.batcher.decide(item, line, now)
        if isinstance(decision, Done):
            return decision.ref
        if isinstance(decision, Send):
            return await self._send(body, what, url)
        if isinstance(decision, Hold):
            raise Held(f"{self.poster.platform} {what} held for the next summary ({len(self.batcher.held)} held, "
                       f"about {decision.wait:.0f} s): {self.limit_text}", decision.wait)
        items = self._fitting(decision.items)
        ref = await self._send(self._summary(items), "summary")
        self.batcher.summarised(items, ref, now)
        if item in items:
            return ref
        raise Held(f"{self.poster.platform} {what} held: the summary was full; it goes in the next one",
                   self.batcher.pace.spacing)

    def _summary(self, items: Mapping[str, str]) -> dict[str, Any]:
        n = len(items)
        head = f"msmon: {n} message{'s' if n != 1 else ''} held back"
        text = f"**{head}** to stay within {self.limit_text}:\n\n" + "\n\n".join(items.values())
        return self.markdown_body(head, text)

    def _fitting(self, items: Mapping[str, str]) -> dict[str, str]:
        """As many of `items`, oldest first, as one summary body can carry (at least one)."""
        out: dict[str, str] = {}
        for item, line in items.items():
            if out and not self.fits(self._summary({**out, item: line})):
                break
            out[item] = line
        return out

    def _line(self, msg: Message) -> str:
        return f"- {title(msg, self.escape)}: value {num(msg.lead.value)} vs threshold {num(msg.lead.threshold)}"

    async def _alert(self, msg: Message, what: str) -> str:
        item = f"{what}:{msg.key}:{msg.status.value}:{msg.lead.step}:{','.join(msg.devices)}"
        return await self._paced(item, self._line(msg), self.alert_body(msg), what)

    async def post(self, channel: str, msg: Message) -> str:
        return await self._alert(msg, "alert")

    async def attach(self, channel: str, ref: str, msg: Message) -> None:
        return None

    async def update(self, channel: str, ref: str, msg: Message) -> None:
        await self._alert(msg, "update")

    async def reply(self, channel: str, ref: str, msg: Message) -> None:
        await self._alert(msg, "reply")

    def note_body(self, note: Note) -> dict[str, Any]:
        """A note (a command's answer, a result) as the platform's markdown message, job text escaped."""
        text = "\n\n".join(self.escape(line) for line in note.text.splitlines())
        return fit_body(lambda t: self.markdown_body("msmon", t), text, self.body_limit)

    async def note(self, note: Note) -> None:
        item = "note:" + (note.command_id or hashlib.sha256(note.text.encode()).hexdigest()[:16])
        first = (note.text.splitlines() or [""])[0]
        await self._paced(item, "- " + self.escape(first), self.note_body(note), "note", self.note_url(note))


def markdown_text(msg: Message, esc: Escape) -> str:
    """The alert as chat markdown (DingTalk, WeCom; Feishu's lark_md): the title in bold, then
    render.text's lines (what happened, value vs threshold, the "now" line, the hint), blank-line separated
    as these renderers break lines. Job data goes through `esc`."""
    lines = text(msg, esc).split("\n")
    return "\n\n".join([f"**{lines[0]}**", *lines[1:]])


def webhook_url(name: str, env: str) -> str:
    """The robot's webhook URL from the environment; an empty one is said once at start: its messages wait in
    the outbox until the bot runs with the URL."""
    url = os.environ.get(env, "")
    if not url:
        log.error("msmon bot: routes use %s but the environment variable %s is empty: its messages wait in the "
                  "outbox until the bot runs with the robot's webhook URL", name, env)
    return url
