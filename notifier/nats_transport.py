"""The job's NATS JetStream edge: `BotTransport`'s requests over NATS instead of HTTP, for very large fleets.

`BotTransport` (notifier/transport/) keeps everything that makes delivery safe: the training thread
only queues, the pure send queue (notifier/sendq/) batches, retries with backoff and spools, the
threads never die. This module is only its `Backend` (notifier/transport/link.py): where each request goes and
what came back, as the same `Reply` the HTTP client gives (subjects: msmon/contract/subjects.py).

    /v1/ingest         JetStream publish to <prefix>.<project>.<run>.env, Nats-Msg-Id = the batch's key
                       (transport/sender.py batch_key), so a batch sent again after a lost PubAck is stored once;
                       the PubAck is the "accepted" (the bot's durable consumer takes it from there)
    /v1/heartbeat      JetStream publish to <prefix>.<project>.<run>.hb
    /v1/commands/poll  the rank's Poll on <prefix>.<project>.<run>.poll, with the reply subject
                       <prefix>.<project>.<run>.cmd.<device>, where a bot replica answers with the commands
    /v1/actions/request  a NATS request on <prefix>.<project>.<run>.act, answered like the HTTP route

Every request carries the job's token in the Msmon-Token header; the bot checks it like HTTP's bearer
token. While NATS is unreachable a request fails at once (`Fault.UNREACHABLE`, nothing buffered in the
client to turn up later), so the queue spools and backs off exactly as it does for HTTP.

nats-py is asyncio: one daemon thread runs its loop; the transport's threads wait on it with a bound.
The module itself imports only the standard library (nats-py when a backend starts).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import logging
import threading
from typing import Any

from msmon.common.urls import redacted
from msmon.contract.subjects import (
    ACTION,
    COMMANDS,
    DEFAULT_PREFIX,
    ENVELOPE,
    HEARTBEAT,
    MSG_ID_HEADER,
    POLL,
    STATUS_HEADER,
    TOKEN_HEADER,
    nats_url_problem,
    prefix_problem,
    subject,
)

from .sendq import Fault, judge
from .transport import BotTransport, Reply

log = logging.getLogger("msmon")

_ACCEPTED = b"{}"  # a stored envelope (commands come on the poll subject)
_ROUTES = {"/v1/ingest": ENVELOPE, "/v1/heartbeat": HEARTBEAT, "/v1/commands/poll": POLL,
           "/v1/actions/request": ACTION}  # path -> subject kind


class NatsBackend:
    """A job's requests as NATS messages (see the module docstring). Never raises from `exchange`."""

    def __init__(self, url: str, project: str, run_id: str, device: str, token: str | None, *,
                 prefix: str = DEFAULT_PREFIX, connect_timeout: float = 2.0) -> None:
        problem = nats_url_problem(url) or prefix_problem(prefix)
        if problem:
            raise ValueError(f"bot.url / bot.nats_prefix: {problem}")
        self.url, self.where = url, redacted(url)
        self.missing = importlib.util.find_spec("nats") is None
        if self.missing:
            log.error("msmon: run %s: bot.url is %s but nats-py is not installed in this job's environment; nothing "
                      "reaches the bot (it is spooled) until it is: pip install nats-py (or msmon[bot])", run_id,
                      self.where)
        self.subjects = {k: subject(prefix, project, run_id, k) for k in (ENVELOPE, HEARTBEAT, POLL, ACTION)}
        self.reply_subject = subject(prefix, project, run_id, COMMANDS, device)
        self._headers = {TOKEN_HEADER: token} if token else {}
        self._connect_timeout = min(max(connect_timeout, 0.1), 30.0)
        self._name = f"msmon job {run_id}/{device}"[:200]
        self._nc: Any = None
        self._js: Any = None
        self._replies: Any = None  # the subscription to this rank's command subject
        self._lock: asyncio.Lock | None = None
        self._closing = False
        self._inflight: set[asyncio.Task[Reply]] = set()  # exchanges on the loop, ended by close()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="msmon-nats", daemon=True)
        self._thread.start()

    # -- the transport's threads --------------------------------------------------------------------

    def exchange(self, path: str, body: bytes, timeout: float, key: str | None) -> Reply:
        if self._closing or self.missing:
            return Reply(Fault.UNREACHABLE, detail="nats-py is not installed" if self.missing else
                         "the NATS backend is closed")
        future = asyncio.run_coroutine_threadsafe(self._exchange(path, body, timeout, key), self._loop)
        try:
            return future.result(timeout + self._connect_timeout + 1.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return Reply(Fault.TIMEOUT, detail=f"no answer from NATS at {self.where} within {timeout:g} s")
        except concurrent.futures.CancelledError:  # close() ended what was in flight
            return Reply(Fault.UNREACHABLE, detail="the NATS backend is closed")
        except Exception as exc:  # noqa: BLE001 - whatever happened on the loop is a Fault here
            return Reply(Fault.BUG, detail=f"{type(exc).__name__}: {exc}"[:300])

    def close(self, timeout: float) -> None:
        """Close the connection (what it holds is flushed) and end the loop's thread, within `timeout`."""
        if self._closing:
            return
        self._closing = True
        future = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
        with contextlib.suppress(Exception):
            future.result(max(timeout, 0.5))
        future.cancel()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(max(timeout, 0.5))

    # -- on the loop ----------------------------------------------------------------------------------

    async def _exchange(self, path: str, body: bytes, timeout: float, key: str | None) -> Reply:
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
        import nats.errors
        import nats.js.errors

        try:
            nc = await self._connected()
        except Exception as exc:  # noqa: BLE001 - refused, DNS, TLS, auth: the server cannot be used now
            return Reply(Fault.UNREACHABLE, detail=f"cannot connect to NATS at {self.where}: "
                                                   f"{type(exc).__name__}: {exc}"[:300])
        if not nc.is_connected:  # reconnecting: fail now rather than buffer a publish that turns up later
            return Reply(Fault.UNREACHABLE, detail=f"NATS at {self.where} is not connected (reconnecting)")
        target = _ROUTES.get(path)
        if target is None:
            return Reply(Fault.REJECTED, 404, detail=f"{path} is not available over NATS")
        target = self.subjects[target]
        try:
            if path == "/v1/commands/poll":
                return await self._poll(nc, body, timeout)
            if path == "/v1/actions/request":
                return self._answer(await nc.request(target, body, timeout=timeout, headers=self._headers))
            headers = dict(self._headers)
            if key is not None:
                headers[MSG_ID_HEADER] = key
            await self._js.publish(target, body, timeout=timeout, headers=headers)
            return Reply(None, 202, _ACCEPTED)
        except (nats.js.errors.NoStreamResponseError, nats.errors.NoRespondersError):
            what = "JetStream stream takes" if path in ("/v1/ingest", "/v1/heartbeat") else "msmon bot answers on"
            return Reply(Fault.UNREACHABLE, detail=f"no {what} {target}: is a bot running with bot.nats.url set "
                                                   "(it creates the stream), with the same prefix?")
        except nats.errors.MaxPayloadError as exc:
            return Reply(Fault.TOO_LARGE, 413, detail=f"over the NATS server's max_payload: {exc}")
        except nats.js.errors.APIError as exc:
            if exc.err_code == 10054:  # the message is over the stream's max_msg_size
                return Reply(Fault.TOO_LARGE, 413, detail=str(exc)[:300])
            return Reply(Fault.SERVER, int(exc.code or 503), detail=f"JetStream: {exc}"[:300])
        except (asyncio.TimeoutError, nats.errors.TimeoutError):
            return Reply(Fault.TIMEOUT, detail=f"no answer on {target} within {timeout:g} s")
        except (nats.errors.Error, OSError) as exc:  # closed, reconnecting, the buffer full
            return Reply(Fault.UNREACHABLE, detail=f"{type(exc).__name__}: {exc}"[:300])

    async def _poll(self, nc: Any, body: bytes, timeout: float) -> Reply:
        """A Poll to the run's poll subject; the answer comes on this rank's command subject."""
        await nc.publish(self.subjects[POLL], body, reply=self.reply_subject, headers=self._headers)
        return self._answer(await self._replies.next_msg(timeout=timeout))

    def _answer(self, msg: Any) -> Reply:
        """A bot replica's answer (its status in the Msmon-Status header) as the HTTP client's `Reply`."""
        headers = msg.headers or {}
        if headers.get("Status") == "503":  # NATS itself: nobody subscribes to the subject
            return Reply(Fault.UNREACHABLE, detail=f"no msmon bot answers on {msg.subject} (is a bot running with "
                                                   "bot.nats.url set, with the same prefix?)")
        try:
            status = int(headers.get(STATUS_HEADER, "200"))
        except ValueError:
            status = 502
        fault = judge(status, msg.data)
        detail = "" if fault is None else msg.data[:200].decode("utf-8", "replace").strip()
        return Reply(fault, status, msg.data, headers.get("Retry-After"), detail)

    async def _connected(self) -> Any:
        """The connection, made on first use (and again after it closed); nats-py reconnects it itself."""
        if self._nc is not None and not self._nc.is_closed:
            return self._nc
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._nc is not None and not self._nc.is_closed:
                return self._nc
            import nats

            async def quiet(exc: Exception) -> None:  # the transport logs each kind of fault once
                log.debug("msmon: NATS at %s: %s: %s", self.where, type(exc).__name__, exc)

            nc = await asyncio.wait_for(nats.connect(
                [u.strip() for u in self.url.split(",")], name=self._name, connect_timeout=self._connect_timeout,
                allow_reconnect=True, max_reconnect_attempts=-1, reconnect_time_wait=0.5, error_cb=quiet,
                pending_size=4 << 20), self._connect_timeout * 2 + 1.0)
            try:
                self._replies = await nc.subscribe(self.reply_subject)  # resubscribed by nats-py on reconnect
            except BaseException:
                await nc.close()
                raise
            self._js = nc.jetstream()
            self._nc = nc
            return nc

    async def _close(self) -> None:
        for task in list(self._inflight):  # a poll still waiting: ended now, not destroyed pending at exit
            task.cancel()
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()


def nats_transport(url: str, run_id: str, device: str = "0", token: str | None = None, *, project: str = "default",
                   prefix: str = DEFAULT_PREFIX, **kwargs: Any) -> BotTransport:
    """A `BotTransport` that reaches the bot through NATS JetStream at `url` (`kwargs`: BotTransport's)."""
    backend = NatsBackend(url, project, run_id, str(device), token, prefix=prefix)
    return BotTransport(url, run_id, device, token, project=project, backend=backend, **kwargs)


__all__ = ["NatsBackend", "nats_transport"]
