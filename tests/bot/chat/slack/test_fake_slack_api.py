"""The loopback Slack API server, driven by slack-sdk's real AsyncWebClient and its retry handlers."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from tests.fakes.slack_api import UPLOAD, SlackAPIServer

BLOCKS = [
    {"type": "header", "text": {"type": "plain_text", "text": "loss spike"}},
    {"type": "section", "text": {"type": "mrkdwn", "text": "*job* `llm-70b` step 1200: loss 9.1 (median 2.3)"}},
    {
        "type": "actions",
        "elements": [
            {"type": "button", "text": {"type": "plain_text", "text": "Ack"}, "action_id": "ack", "value": "a1"}
        ],
    },
]
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8


@pytest.fixture
def server():
    with SlackAPIServer() as s:
        yield s


def client(server: SlackAPIServer, token: str | None = "xoxb-test") -> AsyncWebClient:
    return AsyncWebClient(
        token=token,
        base_url=server.base_url,
        retry_handlers=[
            AsyncRateLimitErrorRetryHandler(max_retry_count=3),
            AsyncServerErrorRetryHandler(max_retry_count=3),
        ],
    )


def test_base_url_is_loopback(server):
    assert server.base_url == f"http://127.0.0.1:{server.port}/api/"

    async def go():
        return await client(server).auth_test()

    res = asyncio.run(go())
    assert res["ok"] is True and res["bot_id"] and res["user_id"]
    [call] = server.calls
    assert call.method == "auth.test" and call.token == "xoxb-test" and call.ok and not call.failed


def test_post_block_kit_message_and_read_back(server):
    async def go():
        c = client(server)
        first = await c.chat_postMessage(channel="C0ALERTS", text="loss spike on llm-70b", blocks=BLOCKS)
        reply = await c.chat_postMessage(channel="C0ALERTS", text="details", thread_ts=first["ts"])
        return first, reply

    first, reply = asyncio.run(go())
    assert first["ok"] and first["channel"] == "C0ALERTS"
    assert first["message"]["text"] == "loss spike on llm-70b"
    assert first["message"]["blocks"] == BLOCKS
    assert reply["message"]["thread_ts"] == first["ts"]
    assert float(reply["ts"]) > float(first["ts"])

    msgs = server.messages()
    assert [m["ts"] for m in msgs] == [first["ts"], reply["ts"]]
    assert msgs[0]["blocks"] == BLOCKS  # decoded to Python objects
    assert msgs[0]["channel"] == "C0ALERTS" and msgs[0]["text"] == "loss spike on llm-70b"
    assert msgs[1]["thread_ts"] == first["ts"]
    assert server.message(first["ts"])["blocks"] == BLOCKS
    assert [c.method for c in server.calls] == ["chat.postMessage", "chat.postMessage"]
    assert server.calls[0].content_type == "application/json"


def test_blocks_as_json_string_in_form_are_decoded(server):
    async def go():
        c = client(server)
        return await c.api_call(
            "chat.postMessage",
            data={"channel": "C1", "text": "t", "blocks": '[{"type": "divider"}]', "attachments": "[]"},
        )

    res = asyncio.run(go())
    assert res["ok"]
    [m] = server.messages()
    assert m["blocks"] == [{"type": "divider"}] and m["attachments"] == []
    assert server.calls[0].content_type == "application/x-www-form-urlencoded"


def test_update_message(server):
    async def go():
        c = client(server)
        posted = await c.chat_postMessage(channel="C0ALERTS", text="loss spike", blocks=BLOCKS)
        new_blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "acked by <@U1>"}}]
        updated = await c.chat_update(channel="C0ALERTS", ts=posted["ts"], text="acked", blocks=new_blocks)
        return posted, updated, new_blocks

    posted, updated, new_blocks = asyncio.run(go())
    assert updated["ok"] and updated["ts"] == posted["ts"] and updated["channel"] == "C0ALERTS"
    assert updated["message"]["blocks"] == new_blocks
    [u] = server.updates()
    assert u["ts"] == posted["ts"] and u["text"] == "acked" and u["blocks"] == new_blocks
    now = server.message(posted["ts"], channel="C0ALERTS")
    assert now["text"] == "acked" and now["blocks"] == new_blocks and now["edited"] == 1
    assert len(server.messages()) == 1  # an update is not a new message
    assert server.messages()[0]["blocks"] == BLOCKS  # the post as it was sent


def test_update_unknown_ts_is_message_not_found(server):
    async def go():
        await client(server).chat_update(channel="C0ALERTS", ts="1700000000.999999", text="x")

    with pytest.raises(SlackApiError) as ei:
        asyncio.run(go())
    assert ei.value.response["error"] == "message_not_found"
    assert server.updates() == []
    [call] = server.calls
    assert call.method == "chat.update" and call.ok is False and call.error == "message_not_found"


def test_files_upload_v2(server):
    async def go():
        c = client(server)
        parent = await c.chat_postMessage(channel="C0ALERTS", text="loss spike")
        res = await c.files_upload_v2(
            channel="C0ALERTS",
            content=PNG,
            filename="chart.png",
            initial_comment="loss, last 2000 steps",
            thread_ts=parent["ts"],
        )
        return parent, res

    parent, res = asyncio.run(go())
    assert res["ok"] and res["file"]["id"] == res["files"][0]["id"]
    [up] = server.uploads()
    assert up["size"] == len(PNG) == up["length"]
    assert up["content"] == PNG
    assert up["channel"] == "C0ALERTS" and up["channels"] == ["C0ALERTS"]
    assert up["filename"] == "chart.png" and up["file_id"] == res["file"]["id"]
    assert up["initial_comment"] == "loss, last 2000 steps"
    assert up["thread_ts"] == parent["ts"]
    assert [c.method for c in server.calls] == [
        "chat.postMessage",
        "files.getUploadURLExternal",
        UPLOAD,
        "files.completeUploadExternal",
    ]
    upload_call = server.calls_to(UPLOAD)[0]
    assert upload_call.params == {"file_id": up["file_id"], "size": len(PNG)}
    complete = server.calls_to("files.completeUploadExternal")[0]
    assert complete.params["files"][0]["id"] == up["file_id"]  # JSON text decoded


def test_rate_limited_then_success_is_retried_once(server):
    server.fail("chat.postMessage", status=429, times=1, retry_after=1)

    async def go():
        return await client(server).chat_postMessage(channel="C0ALERTS", text="loss spike", blocks=BLOCKS)

    t0 = time.monotonic()
    res = asyncio.run(go())
    assert res["ok"]
    calls = server.calls_to("chat.postMessage")
    assert [(c.http_status, c.failed) for c in calls] == [(429, True), (200, False)]
    assert calls[1].time - calls[0].time >= 1.0  # the handler honoured Retry-After
    assert time.monotonic() - t0 < 5
    assert len(server.messages()) == 1 and server.messages()[0]["ts"] == res["ts"]
    assert server.pending_failures("chat.postMessage") == 0


def test_server_error_then_success_is_retried_once(server):
    server.fail("chat.postMessage", status=500, times=1)

    async def go():
        return await client(server).chat_postMessage(channel="C0ALERTS", text="loss spike")

    res = asyncio.run(go())
    assert res["ok"]
    calls = server.calls_to("chat.postMessage")
    assert [(c.http_status, c.failed) for c in calls] == [(500, True), (200, False)]
    assert len(server.messages()) == 1


def test_503_on_upload_url_is_retried(server):
    server.fail(UPLOAD, status=503, times=1)

    async def go():
        return await client(server).files_upload_v2(channel="C0ALERTS", content=PNG, filename="chart.png")

    res = asyncio.run(go())
    assert res["ok"]
    assert [(c.http_status, c.failed) for c in server.calls_to(UPLOAD)] == [(503, True), (200, False)]
    [up] = server.uploads()
    assert up["size"] == len(PNG) and up["channel"] == "C0ALERTS"


def test_retries_exhausted_raise(server):
    server.fail("auth.test", status=500, times=5)
    c = AsyncWebClient(
        token="xoxb-test", base_url=server.base_url, retry_handlers=[AsyncServerErrorRetryHandler(max_retry_count=1)]
    )

    with pytest.raises(SlackApiError) as ei:
        asyncio.run(c.auth_test())
    assert ei.value.response.status_code == 500
    assert len(server.calls_to("auth.test")) == 2
    assert server.pending_failures("auth.test") == 3


def test_missing_token_is_refused(server):
    async def go():
        await client(server, token=None).chat_postMessage(channel="C0ALERTS", text="hi")

    with pytest.raises(SlackApiError) as ei:
        asyncio.run(go())
    assert ei.value.response["error"] == "not_authed"
    assert server.messages() == []
    [call] = server.calls
    assert call.token is None and call.ok is False and call.error == "not_authed"


def test_non_bot_token_is_refused(server):
    with pytest.raises(SlackApiError) as ei:
        asyncio.run(client(server, token="xoxp-user").auth_test())
    assert ei.value.response["error"] == "not_authed"


def test_usable_from_other_threads_and_wait_for(server):
    def worker(i: int) -> None:
        asyncio.run(client(server).chat_postMessage(channel="C0ALERTS", text=f"m{i}"))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    assert server.wait_for(lambda s: len(s.messages()) == 4, timeout=5)
    for t in threads:
        t.join()
    tss = [m["ts"] for m in server.messages()]
    assert len(set(tss)) == 4 and tss == sorted(tss)
    assert sorted(m["text"] for m in server.messages()) == ["m0", "m1", "m2", "m3"]
    assert server.wait_for(lambda s: False, timeout=0.05) is False


def test_start_stop_without_context_manager():
    s = SlackAPIServer()
    s.start()
    try:
        asyncio.run(client(s).auth_test())
        assert len(s.calls) == 1
    finally:
        s.stop()
    s.stop()  # idempotent
