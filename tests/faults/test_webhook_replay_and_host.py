"""Issue 10 item 10: a captured signed webhook body is not accepted again with its delivery id
dropped or changed; Standard Webhooks timestamped signatures with a tolerance window; a Host
allow-list (loopback names by default) against DNS rebinding."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from channels.webhooks import sign, sign_standard
from gateway import keys as K
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app, tree_digest

SECRET = "a webhook secret"
STANDARD_SECRET = "whsec_" + base64.b64encode(b"sixteen byte key").decode()
ENV = {"HOOK_SECRET": SECRET, "STD_SECRET": STANDARD_SECRET}
HOOKS = {
    "hooks": {
        "gh": {"secret_env": "HOOK_SECRET", "key_template": "hook:gh:${n}", "message_template": "event ${n}"},
        "std": {
            "secret_env": "STD_SECRET",
            "key_template": "hook:std:${n}",
            "message_template": "event ${n}",
            "tolerance_s": 60,
        },
        "strict": {"secret_env": "HOOK_SECRET", "require_timestamp": True},
    }
}


def github(body: bytes, delivery: str | None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json", "X-Hub-Signature-256": sign(SECRET.encode(), body)}
    if delivery is not None:
        headers["X-GitHub-Delivery"] = delivery
    return {"data": body, "headers": headers}


def standard(body: bytes, msg_id: str, when: int, *, secret: str = STANDARD_SECRET, extra: str = "") -> dict[str, Any]:
    signature = sign_standard(secret.encode(), msg_id, when, body)
    headers = {"Content-Type": "application/json", "webhook-id": msg_id, "webhook-timestamp": str(when),
               "webhook-signature": f"{extra} {signature}".strip()}  # fmt: skip
    return {"data": body, "headers": headers}


def count_messages(home: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in home.glob("contexts/running/*/messages.jsonl"))


async def test_a_replayed_github_body_is_a_duplicate_whatever_its_delivery_id(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, HOOKS, env=ENV))
    body = json.dumps({"n": 1}).encode()
    first = await client.post("/hooks/gh", **github(body, "id-1"))
    assert first.status == 202, await first.text()
    for delivery in (None, "id-2", "something-else"):
        again = await client.post("/hooks/gh", **github(body, delivery))
        answer = await again.json()
        assert again.status == 200 and answer["status"] == "duplicate", answer
        assert answer["message_seq"] == 1
    other = await client.post("/hooks/gh", **github(json.dumps({"n": 1, "x": 2}).encode(), None))
    assert other.status == 202  # another body is another event
    assert count_messages(tmp_path) == 2
    await client.close()
    # The replay cache is tasks.db: a restarted gateway still knows the signature.
    client = await aiohttp_client(make_app(tmp_path, clock, HOOKS, env=ENV))
    again = await client.post("/hooks/gh", **github(body, "id-3"))
    assert again.status == 200 and (await again.json())["status"] == "duplicate"
    assert count_messages(tmp_path) == 2


async def test_standard_webhooks_signatures_and_their_window(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, HOOKS, env=ENV))
    now = int(clock().timestamp())
    body = json.dumps({"n": 7}).encode()
    wrong = sign_standard(b"another secret", "msg_1", now, body)
    resp = await client.post("/hooks/std", **standard(body, "msg_1", now, extra=wrong))  # one of several matches
    assert resp.status == 202, await resp.text()
    replay = await client.post("/hooks/std", **standard(body, "msg_1", now))
    assert replay.status == 200 and (await replay.json())["status"] == "duplicate"

    app = client.server.app  # what the accepted delivery left pending is on disk first: its turn,
    await app[K.WEBHOOKS].idle()  # sessions.json, and the writer's queue (the run's `.opening` marker
    store = app[K.STORE]  # is unlinked after the answer: a digest taken before saw it vanish)
    await store.registry.flush()
    await store.writer.call(lambda: None)
    before = tree_digest(tmp_path)
    captured = standard(body, "msg_1", now)
    captured["headers"]["webhook-id"] = "msg_2"  # an id the signature does not cover
    stale = standard(json.dumps({"n": 8}).encode(), "msg_3", now - 61)
    future = standard(json.dumps({"n": 9}).encode(), "msg_4", now + 61)
    no_time = standard(body, "msg_5", now)
    del no_time["headers"]["webhook-timestamp"]
    strict = {
        "data": b"{}",
        "headers": {"Content-Type": "application/json", "X-Hub-Signature-256": sign(SECRET.encode(), b"{}")},
    }
    for path, kwargs, hint in (
        ("/hooks/std", captured, "no webhook-signature entry matches"),
        ("/hooks/std", stale, "tolerance is 60 s"),
        ("/hooks/std", future, "tolerance is 60 s"),
        ("/hooks/std", no_time, "webhook-timestamp"),
        ("/hooks/strict", strict, "timestamped signatures only"),
    ):
        resp = await client.post(path, **kwargs)
        error = (await resp.json())["error"]
        assert resp.status == 401 and error["code"] == "invalid_signature" and hint in error["message"], error
    assert tree_digest(tmp_path) == before

    clock.advance(seconds=59)  # still inside the window: a new event signed a minute ago is fine
    late = await client.post("/hooks/std", **standard(json.dumps({"n": 10}).encode(), "msg_6", now))
    assert late.status == 202
    ok = await client.post("/hooks/strict", **standard(b"{}", "msg_7", now + 59, secret=SECRET))
    assert ok.status == 202, await ok.text()


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:8787", 200),
        ("localhost:8787", 200),
        ("localhost", 200),
        ("[::1]:8787", 200),
        ("127.0.0.2", 200),
        ("app.localhost:8787", 200),
        ("LOCALHOST.:8787", 200),
        ("evil.example:8787", 403),
        ("evil.example", 403),
        ("127.0.0.1.evil.example", 403),
        ("10.0.0.5:8787", 403),
    ],
)
async def test_without_tokens_only_loopback_host_names_are_served(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, host: str, status: int
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    before = tree_digest(tmp_path)
    resp = await client.post(
        "/v1/sessions/agent%3Amain%3Amain/messages", json={"content": "hi"}, headers={"Host": host}
    )
    assert resp.status == status, await resp.text()
    if status == 403:
        error = (await resp.json())["error"]
        assert error["code"] == "host_not_allowed" and "gateway.allowed_hosts" in error["message"]
        assert tree_digest(tmp_path) == before
        health = await client.get("/healthz", headers={"Host": host})
        assert health.status == 403


async def test_allowed_hosts_and_tokens(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> None:
    client = await aiohttp_client(make_app(tmp_path / "a", clock, {"gateway": {"allowed_hosts": ["gw.internal"]}}))
    assert (await client.get("/healthz", headers={"Host": "gw.internal:8787"})).status == 200
    assert (await client.get("/healthz", headers={"Host": "localhost"})).status == 200
    assert (await client.get("/healthz", headers={"Host": "evil.example"})).status == 403
    await client.close()
    # With tokens the bearer token guards the API; any Host is served unless allowed_hosts is set.
    client = await aiohttp_client(make_app(tmp_path / "b", clock, {"gateway": {"tokens": ["t0k3n"]}}))
    assert (await client.get("/healthz", headers={"Host": "gw.example.com"})).status == 200
    resp = await client.get("/v1/sessions", headers={"Host": "gw.example.com"})
    assert resp.status == 401


async def test_signature_spellings_of_one_delivery_store_it_once(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    """Issue 24 item 16: the replay cache is keyed by the verified digest, so a space or tab after
    ``sha256=``, upper-case hex or another order of Standard Webhooks entries is the same delivery."""
    client = await aiohttp_client(make_app(tmp_path, clock, HOOKS, env=ENV))
    body = json.dumps({"n": 11}).encode()
    hexdigest = sign(SECRET.encode(), body).removeprefix("sha256=")
    spellings = [f"sha256={hexdigest}", f"sha256= {hexdigest}", f"sha256=\t{hexdigest}", f"sha256={hexdigest} ",
                 f"sha256=  {hexdigest.upper()}", f"sha256=\t {hexdigest}\t"]  # fmt: skip
    statuses = []
    for spelling in spellings:
        headers = {"Content-Type": "application/json", "X-Hub-Signature-256": spelling}
        resp = await client.post("/hooks/gh", data=body, headers=headers)
        statuses.append(resp.status)
    assert statuses == [202] + [200] * (len(spellings) - 1)
    assert count_messages(tmp_path) == 1

    now = int(clock().timestamp())
    std_body = json.dumps({"n": 12}).encode()
    right = sign_standard(STANDARD_SECRET.encode(), "msg_s", now, std_body)
    wrong = sign_standard(b"another secret", "msg_s", now, std_body)
    other = sign_standard(b"a third secret", "msg_s", now, std_body)
    variants = [right, f"{wrong} {right}", f"{right}\t{wrong}", f"  {other}\t\t{right}  {wrong} ", f"\t{right}"]
    std_statuses = []
    for i, header in enumerate(variants):
        headers = {"Content-Type": "application/json", "webhook-id": "msg_s", "webhook-timestamp": str(now),
                   "webhook-signature": header}  # fmt: skip
        headers["X-GitHub-Delivery"] = f"std-{i}"  # a new delivery id each time: the signature cache alone holds
        resp = await client.post("/hooks/std", data=std_body, headers=headers)
        std_statuses.append(resp.status)
    assert std_statuses == [202] + [200] * (len(variants) - 1)
    assert count_messages(tmp_path) == 2
