"""Feishu/Lark custom bot: the real bot's outbox posting interactive cards through FeishuReceiver to a
local bot webhook (tests/fakes/feishu_api.py) that checks the body's signature and timestamp window,
its schema and 20 KB, and 100 a minute / 5 a second, answering with Feishu's codes. Injected clock."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pytest

from bot.chat.feishu.receiver import FeishuReceiver
from bot.receivers import DeliveryError, Note
from tests.fakes.feishu_api import FeishuBot
from tests.fakes.im_harness import T0, Clock, ImBot, message
from tests.fakes.records import event

SECRET = "feishu-secret"


def test_a_signed_card_carries_the_alert_with_job_text_escaped(tmp_path):
    async def scenario() -> None:
        clock = Clock()
        bot_api = FeishuBot(clock, secret=SECRET)
        async with bot_api.serving() as base:
            rx = FeishuReceiver(f"{base}/open-apis/bot/v2/hook/hook-token", SECRET, clock)
            bot = ImBot(tmp_path, rx, clock)
            bot.ingest([event(run='run-1 <at id=all></at> [x](http://evil)')])
            await bot.drain(T0 + 5)
            (call,) = bot_api.delivered
            card = call.body["card"]
            assert call.body["msg_type"] == "interactive" and card["header"]["template"] == "red"
            assert card["header"]["title"]["content"].startswith("ERROR grad_norm: run run-1 <at id=all>")  # plain text
            md = card["elements"][0]["text"]["content"]
            assert "<at" not in md and "&lt;at id=all&gt;" in md and "](http" not in md
            assert "value 12 vs threshold 10" in md and "now: loss 2.4" in md and "Save a checkpoint now." in md
            bot.close()
            await rx.close()
    asyncio.run(scenario())


@pytest.mark.parametrize(("secret", "skew"), [("not-the-secret", 0.0), (SECRET, 3601.0)])
def test_a_wrong_signature_or_an_hour_old_timestamp_is_19021(secret, skew):
    async def scenario() -> None:
        clock = Clock()
        bot_api = FeishuBot(clock, secret=SECRET)
        async with bot_api.serving() as base:
            rx = FeishuReceiver(f"{base}/open-apis/bot/v2/hook/hook-token", secret, Clock(T0 - skew))
            with pytest.raises(DeliveryError, match="code 19021: sign match fail"):
                await rx.post("c", message(event()))
            await rx.close()
    asyncio.run(scenario())


def test_a_huge_alert_is_cut_to_feishus_20_kb_and_accepted():
    async def scenario() -> None:
        clock = Clock()
        bot_api = FeishuBot(clock, secret=SECRET)
        async with bot_api.serving() as base:
            rx = FeishuReceiver(f"{base}/open-apis/bot/v2/hook/hook-token", SECRET, clock)
            e = event()
            e.hint = "<b>&" * 20_000  # 80 kB of text that escaping makes longer still
            await rx.post("c", message(e))
            (call,) = bot_api.delivered
            assert len(call.raw) <= 20 * 1024
            assert len(json.dumps(call.body, ensure_ascii=False).encode()) <= 20 * 1024
            await rx.close()
    asyncio.run(scenario())


def test_feishus_frequency_limit_11232_is_a_retry_after_and_the_budget_keeps_5_a_second():
    async def scenario() -> None:
        clock = Clock()
        bot_api = FeishuBot(clock)
        async with bot_api.serving() as base:
            url = f"{base}/open-apis/bot/v2/hook/hook-token"
            rx = FeishuReceiver(url, None, clock)
            for _ in range(5):
                await rx.note(Note(text="c1 done"))
            with pytest.raises(DeliveryError, match="held"):  # the 6th in the same second waits, unsent
                await rx.note(Note(text="c2 done"))
            assert len(bot_api.calls) == 5
            other = FeishuReceiver(url, None, clock)  # another sender on the same bot: Feishu refuses it
            with pytest.raises(DeliveryError, match="code 11232") as info:
                await other.note(Note(text="c3 done"))
            assert info.value.retry_after == 60.0
            await rx.close()
            await other.close()
    asyncio.run(scenario())


def test_an_unknown_hook_token_is_named():
    async def scenario() -> None:
        clock = Clock()
        bot_api = FeishuBot(clock)
        async with bot_api.serving() as base:
            rx = FeishuReceiver(f"{base}/open-apis/bot/v2/hook/wrong", None, clock)
            with pytest.raises(DeliveryError, match="code 19001: param invalid: incoming webhook access token"):
                await rx.post("c", message(event()))
            await rx.close()
    asyncio.run(scenario())



# -- commands: the app bot's event subscription, through the real bot on loopback -----------------------

TOKEN, KEY = "v-token", "encrypt-key"


def _commands_bot(bot_server, tmp_path, feishu: dict | None = None):

    return bot_server({"bot": {
        "feishu": feishu or {},
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "feishu", "channel": "oc_team"}],
        "pipeline": {"group_wait": 0.0},
        "commands": {"allow": [{"project": "llm", "users": ["feishu:ou_alice"]}]},
        "console": {"charts": False}}})


def _post(bot, headers, body):
    import urllib.request

    from tests.fakes.bot_server import send

    req = urllib.request.Request(bot.url + "/feishu/events", data=body, method="POST", headers=headers)
    return send(req)


def test_an_allowed_users_pause_is_queued_and_answered_in_the_chat_a_strangers_refused(tmp_path, monkeypatch,
                                                                                       bot_server):
    from tests.fakes.feishu_api import event_request, message_event
    from tests.fakes.records import envelope

    async def scenario() -> None:
        bot_api = FeishuBot(time.time)
        async with bot_api.serving() as base:
            monkeypatch.setenv("FEISHU_WEBHOOK_URL", f"{base}/open-apis/bot/v2/hook/hook-token")
            bot = await asyncio.to_thread(_commands_bot, bot_server, tmp_path)
            try:
                status, _ = await asyncio.to_thread(bot.request, "POST", "/v1/ingest", envelope([event()]))
                assert status == 202
                await wait_for_async(lambda: len(bot_api.delivered) == 1)  # the alert's card
                status, answer = await asyncio.to_thread(_post, bot, *event_request(
                    message_event("pause run-42", TOKEN), KEY))
                assert (status, answer) == (200, {"msg": "success"})
                await wait_for_async(lambda: len(bot_api.delivered) == 2)
                note = bot_api.delivered[1].body["card"]["elements"][0]["text"]["content"]
                assert "feishu:ou\\_alice: \\`pause run-42\\` queued as c1" in note
                status, _ = await asyncio.to_thread(_post, bot, *event_request(
                    message_event("stop run-42 confirm", TOKEN, open_id="ou_mallory", event_id="ev-2"), KEY))
                await wait_for_async(lambda: len(bot_api.delivered) == 3)
                assert "may not \\`stop\\` runs of project llm" in bot_api.delivered[2].body["card"]["elements"][0][
                    "text"]["content"]
                # Feishu pushes ev-1 again: it was taken once, nothing is done twice
                await asyncio.to_thread(_post, bot, *event_request(message_event("pause run-42", TOKEN), KEY))
                await asyncio.sleep(0.5)
                assert len(bot_api.delivered) == 3
            finally:
                await asyncio.to_thread(bot.stop)
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", TOKEN)
    monkeypatch.setenv("FEISHU_ENCRYPT_KEY", KEY)
    asyncio.run(scenario())


def test_url_verification_echoes_the_challenge_and_forgeries_are_401(tmp_path, monkeypatch, bot_server):
    from tests.fakes.feishu_api import encrypt, event_request, message_event

    monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", TOKEN)
    monkeypatch.setenv("FEISHU_ENCRYPT_KEY", KEY)
    bot = _commands_bot(bot_server, tmp_path)
    challenge = json.dumps({"challenge": "ajls384kdjx98XX", "token": TOKEN, "type": "url_verification"}).encode()
    body = json.dumps({"encrypt": encrypt(challenge, KEY)}).encode()
    assert _post(bot, {"Content-Type": "application/json"}, body) == (200, {"challenge": "ajls384kdjx98XX"})
    wrong = json.dumps({"challenge": "x", "token": "nope", "type": "url_verification"}).encode()
    status, _ = _post(bot, {}, json.dumps({"encrypt": encrypt(wrong, KEY)}).encode())
    assert status == 401
    headers, body = event_request(message_event("pause run-42", TOKEN), KEY)
    assert _post(bot, {**headers, "X-Lark-Signature": "0" * 64}, body)[0] == 401  # bad signature
    assert _post(bot, *event_request(message_event("pause run-42", TOKEN), "another-key"))[0] == 401
    assert _post(bot, *event_request(message_event("pause run-42", TOKEN)))[0] == 401  # not encrypted
    assert _post(bot, {}, b"not json")[0] == 401  # one answer for every refusal


def test_the_documented_decryption_example():
    """Feishu's event subscription guide: Encrypt Key "test key" turns this into "hello world"."""
    from bot.chat.feishu.inbound import decrypt

    assert decrypt("P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk=", "test key") == b"hello world"


async def wait_for_async(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_the_chart_is_a_signed_expiring_link_the_bot_serves(tmp_path, monkeypatch, bot_server):
    """An ERROR's card, then a card linking to the chart at the bot's GET /charts/<token>; an edited or
    expired link is 403 with the reason."""
    import urllib.request

    from bot.charts.links import ChartLinks
    from tests.fakes.bot_server import send

    monkeypatch.setenv("MSMON_CHART_LINK_SECRET", "link-key")

    async def scenario() -> None:
        clock = Clock()
        bot_api = FeishuBot(clock)
        async with bot_api.serving() as base:
            links = ChartLinks(b"link-key", 3600.0, tmp_path / "links", "http://bot.example", clock)
            rx = FeishuReceiver(f"{base}/open-apis/bot/v2/hook/hook-token", None, clock, links)
            bot = ImBot(tmp_path, rx, clock, charts=True)
            bot.ingest([event()])
            await bot.drain(T0 + 5)
            alert, chart = bot_api.delivered
            md = chart.body["card"]["elements"][0]["text"]["content"]
            url = md[md.index("(http://bot.example/charts/") + 1:-1]
            token = url.rsplit("/", 1)[1]
            path = links.check(token)
            assert not isinstance(path, str) and path.read_bytes().startswith(b"\x89PNG")
            clock.t += 3601
            assert links.check(token).startswith("the link expired")  # type: ignore[union-attr]
            bot.close()
            await rx.close()
            return token
    token = asyncio.run(scenario())

    server = bot_server({"bot": {"port": 0, "state_path": str(tmp_path / "served.sqlite"),
                                 "console": {"charts_dir": str(tmp_path)},
                                 "chart_links": {"public_url": "http://bot.example", "ttl": 3600}}})
    # the link was made at T0 (2023) with an hour to live: expired by the bot's real clock
    status, reason = send(urllib.request.Request(f"{server.url}/charts/{token}"))
    assert status == 403 and "expired" in str(reason)
    fresh = ChartLinks(b"link-key", 3600.0, tmp_path / "links", "http://bot.example").publish(b"\x89PNG fresh")
    with urllib.request.urlopen(server.url + "/charts/" + fresh.rsplit("/", 1)[1], timeout=10) as resp:
        assert resp.read() == b"\x89PNG fresh" and resp.headers["Content-Type"] == "image/png"
    forged = fresh.rsplit("/", 1)[1][:-4] + "0000"
    assert send(urllib.request.Request(server.url + "/charts/" + forged))[0] == 403


def test_with_app_credentials_the_chart_is_uploaded_and_shown_as_an_image(tmp_path):
    async def scenario() -> None:
        clock = Clock()
        bot_api = FeishuBot(clock, app=("cli_msmon", "app-secret"))
        async with bot_api.serving() as base:
            rx = FeishuReceiver(f"{base}/open-apis/bot/v2/hook/hook-token", None, clock,
                                app=("cli_msmon", "app-secret", base))
            bot = ImBot(tmp_path, rx, clock, charts=True)
            bot.ingest([event(run="run-1"), event(run="run-1", rule="loss_spike")])
            await bot.drain(T0 + 5)
            cards = [c.body["card"] for c in bot_api.delivered]
            images = [e for card in cards for e in card["elements"] if e["tag"] == "img"]
            assert [e["img_key"] for e in images] == ["img_v2_1", "img_v2_2"]
            assert all(png.startswith(b"\x89PNG") for png in bot_api.images)
            assert len(bot_api.tokens) == 1  # the tenant_access_token is kept for its two hours
            wrong = FeishuReceiver(f"{base}/open-apis/bot/v2/hook/hook-token", None, clock,
                                   app=("cli_msmon", "not-it", base))
            with pytest.raises(DeliveryError, match="code 10014"):
                await wrong.attach("c", "ref", dataclasses.replace(message(event()), chart=b"\x89PNG"))
            bot.close()
            await rx.close()
            await wrong.close()
    asyncio.run(scenario())


def test_with_app_credentials_the_answer_is_a_reply_to_the_command_message(tmp_path, monkeypatch, bot_server):
    from tests.fakes.feishu_api import event_request, message_event

    monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", TOKEN)
    monkeypatch.setenv("FEISHU_APP_SECRET", "app-secret")

    async def scenario() -> None:
        bot_api = FeishuBot(time.time, app=("cli_msmon", "app-secret"))
        async with bot_api.serving() as base:
            monkeypatch.setenv("FEISHU_WEBHOOK_URL", f"{base}/open-apis/bot/v2/hook/hook-token")
            bot = await asyncio.to_thread(_commands_bot, bot_server, tmp_path,
                                          {"app_id": "cli_msmon", "api_base": base})
            try:
                status, _ = await asyncio.to_thread(_post, bot, *event_request(
                    message_event("status run-42", TOKEN, message_id="om_cmd")))
                assert status == 200
                await wait_for_async(lambda: len(bot_api.replies) == 1)
                message_id, card = bot_api.replies[0]
                assert message_id == "om_cmd"
                assert "No run \\`run-42\\` has reported to this bot" in card["elements"][0]["text"]["content"]
                assert not bot_api.delivered  # not through the group's webhook
            finally:
                await asyncio.to_thread(bot.stop)
    asyncio.run(scenario())


# -- hostile: replays, forgeries, the padding oracle, odd fields ---------------------------------------------

def _queued(bot) -> list[str]:
    return [c["text"] if "text" in c else str(c) for c in bot.store.commands.recent()]


def _hostile_bot(bot_server, tmp_path, monkeypatch):
    from tests.fakes.records import envelope

    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", TOKEN)
    monkeypatch.setenv("FEISHU_ENCRYPT_KEY", KEY)
    monkeypatch.setenv("FEISHU_WEBHOOK_URL", "http://127.0.0.1:9/open-apis/bot/v2/hook/none")
    bot = _commands_bot(bot_server, tmp_path)
    assert bot.request("POST", "/v1/ingest", envelope([event()]))[0] == 202
    return bot


def test_a_replayed_or_old_signed_event_is_never_applied_twice_even_after_a_restart(tmp_path, monkeypatch, bot_server):
    from tests.fakes.feishu_api import event_request, message_event

    bot = _hostile_bot(bot_server, tmp_path, monkeypatch)
    request = event_request(message_event("scale-lr run-42 0.5", TOKEN, event_id="ev-scale"), KEY)
    assert _post(bot, *request) == (200, {"msg": "success"})
    assert len(bot.store.commands.recent()) == 1
    for _ in range(3):  # the same signed request again: taken once
        assert _post(bot, *request)[0] == 200
    assert len(bot.store.commands.recent()) == 1
    old = event_request(message_event("scale-lr run-42 0.5", TOKEN, event_id="ev-old"), KEY,
                        timestamp=str(int(time.time()) - 7200))  # signed two hours ago
    assert _post(bot, *old)[0] == 401
    assert len(bot.store.commands.recent()) == 1
    bot.stop()
    bot = _commands_bot(bot_server, tmp_path)
    # Feishu re-pushes the event after the restart, freshly signed: its event_id is remembered
    again = event_request(message_event("scale-lr run-42 0.5", TOKEN, event_id="ev-scale"), KEY)
    assert _post(bot, *again)[0] == 200
    assert len(bot.store.commands.recent()) == 1
    other = event_request(message_event("pause run-42", TOKEN, event_id="ev-other"), KEY)
    assert _post(bot, *other)[0] == 200
    assert len(bot.store.commands.recent()) == 2


def test_every_refusal_is_the_same_answer_so_nothing_tells_a_good_padding_from_a_bad_one(tmp_path, monkeypatch,
                                                                                         bot_server):
    import base64
    import hashlib

    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    from tests.fakes.feishu_api import encrypt, event_request, message_event

    def raw_cipher(plain_blocks: bytes) -> str:  # no padding added: the last byte decides the padding's fate
        iv = b"\0" * 16
        enc = Cipher(algorithms.AES(hashlib.sha256(KEY.encode()).digest()), modes.CBC(iv)).encryptor()
        return base64.b64encode(iv + enc.update(plain_blocks) + enc.finalize()).decode()

    def unsigned(encrypt_field: str) -> tuple[dict[str, str], bytes]:
        return {"Content-Type": "application/json"}, json.dumps({"encrypt": encrypt_field}).encode()

    def signed_as(body: bytes, ts: str) -> dict[str, str]:
        from bot.chat.feishu.inbound import signature

        return {"Content-Type": "application/json", "X-Lark-Request-Timestamp": ts, "X-Lark-Request-Nonce": "n",
                "X-Lark-Signature": signature(ts, "n", KEY, body)}

    bot = _hostile_bot(bot_server, tmp_path, monkeypatch)
    try:
        good_headers, good_body = event_request(message_event("pause run-42", TOKEN, event_id="ev-x"), KEY)
        bad_padding = raw_cipher(b"A" * 31 + b"\x07")
        good_padding_not_json = raw_cipher(b"A" * 31 + b"\x01")
        now = str(int(time.time()))
        tampered = good_body.replace(good_body[20:24], b"AAAA")
        answers = [
            _post(bot, *unsigned(bad_padding)),
            _post(bot, *unsigned(good_padding_not_json)),
            _post(bot, *unsigned(encrypt(json.dumps(message_event("pause run-42", TOKEN)).encode(), KEY))),
            _post(bot, *unsigned("not base64!")),
            _post(bot, {**good_headers, "X-Lark-Signature": "0" * 64}, good_body),
            _post(bot, good_headers, tampered),
            _post(bot, signed_as(json.dumps({"encrypt": bad_padding}).encode(), now),
                  json.dumps({"encrypt": bad_padding}).encode()),
            _post(bot, signed_as(json.dumps({"encrypt": good_padding_not_json}).encode(), now),
                  json.dumps({"encrypt": good_padding_not_json}).encode()),
            _post(bot, *event_request(message_event("pause run-42", "wrong-token", event_id="ev-y"), KEY)),
            _post(bot, *event_request(message_event("pause run-42", TOKEN, event_id="ev-z"), KEY,
                                      timestamp=str(int(time.time()) + 3600))),
        ]
        assert {a[0] for a in answers} == {401}
        assert len({str(a[1]) for a in answers}) == 1, answers
        assert bot.store.commands.recent() == []
    finally:
        bot.stop()


@pytest.mark.parametrize("field", ["create_time", "content"])
def test_odd_create_times_and_huge_or_deep_contents_are_never_a_5xx(tmp_path, monkeypatch, field, bot_server):
    from tests.fakes.feishu_api import event_request, message_event

    bot = _hostile_bot(bot_server, tmp_path, monkeypatch)
    odd = {"create_time": ["\u00b2", "9" * 400, "-5", "", "1e99", "\U0001d7d9" * 3],
           "content": ["[" * 100_000, json.dumps({"text": "pause run-42 " + "x" * 600_000}),
                       json.dumps({"text": ["a"]}), "\ud800"]}[field]
    try:
        for i, value in enumerate(odd):
            ev = message_event("pause run-42", TOKEN, event_id=f"ev-{field}-{i}")
            if field == "create_time":
                ev["header"]["create_time"] = ev["event"]["message"]["create_time"] = value
            else:
                ev["event"]["message"]["content"] = value
            status, _ = _post(bot, *event_request(ev, KEY))
            assert status < 500, (value[:20], status)
        assert bot.request("GET", "/healthz", token=None)[0] == 200
    finally:
        bot.stop()
