"""Compaction, /compact, /uncompact, overflow recovery, final summaries and inheritance, through
the HTTP API on real files (store-only and against the local OpenAI-compatible server)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer, RecordedRequest, reply

Client = TestClient[Any, Any]
MAIN = "/v1/sessions/agent%3Amain%3Amain"


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def run_dir(home: Path, run_id: str) -> Path:
    for state in ("running", "paused", "completed"):
        if (home / "contexts" / state / run_id).is_dir():
            return home / "contexts" / state / run_id
    raise AssertionError(f"no folder for {run_id}")


async def post(client: Client, text: str, **extra: Any) -> dict[str, Any]:
    resp = await client.post(f"{MAIN}/messages", json={"content": text, **extra})
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


def summary_rule(request: RecordedRequest) -> Any:
    if "compress a conversation" in request.system_text or "final summary" in request.system_text:
        return reply(f"MODEL SUMMARY of {len(request.last_user_text)} chars")
    return None


async def test_store_only_compaction_at_the_threshold(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> None:
    app = make_app(tmp_path, clock, {"compaction": {"token_threshold": 1000}})
    client = await aiohttp_client(app)
    bodies = [await post(client, f"message number {i} about ticket #{i} " + "x" * 100) for i in range(40)]
    compacted = [b for b in bodies if any(e["type"] == "compaction" for e in b["events"])]
    assert compacted, "the reply that follows a compaction says so"
    folder = run_dir(tmp_path, bodies[0]["run_id"])
    assert [m["seq"] for m in jsonl(folder / "messages.jsonl")] == list(range(1, 41))  # untouched
    summaries = [s for s in jsonl(folder / "summaries.jsonl") if s["type"] == "compaction"]
    first = summaries[0]
    assert first["summarizer"] == "extractive" and first["trigger"] == "auto"
    assert {"id", "summary", "compressed_message_count", "tokens_saved", "created_at", "start_seq", "end_seq",
            "tokens_before", "tokens_after"} <= set(first)  # fmt: skip
    assert first["tokens_after"] < first["tokens_before"] and "#0" in first["summary"]
    assert (folder / "compactions" / "1.jsonl").exists()
    current = jsonl(folder / "current.jsonl")
    assert current[0]["kind"] == "summary" and current[0]["role"] == "system"
    context = await (await client.get(f"{MAIN}/context")).json()
    assert context["tokens"] < 1000 and context["messages"][1]["kind"] == "summary"
    status = await post(client, "/status")
    assert f"Compactions: {len(summaries)}" in status["reply"]["content"]


async def test_compact_and_uncompact_walk_back(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    nothing = await post(client, "/uncompact")
    assert nothing["reply"]["content"].startswith("Nothing to undo")
    for i in range(16):
        await post(client, f"first batch {i}: " + "we discussed the rollout plan at length " * 8)
    first = await post(client, "/compact focus on decisions")
    assert "Compacted messages 1-6" in first["reply"]["content"] and first["events"][-1]["type"] == "compaction"
    for i in range(10):
        await post(client, f"second batch {i}: " + "then we reviewed the metrics in detail " * 8)
    second = await post(client, "/compact")
    assert "Compacted messages 7-" in second["reply"]["content"]
    folder = run_dir(tmp_path, first["run_id"])
    records = jsonl(folder / "summaries.jsonl")
    assert records[0]["instructions"] == "focus on decisions" and records[0]["trigger"] == "manual"
    context_after_two = (await (await client.get(f"{MAIN}/context")).json())["messages"]
    undo = await post(client, "/uncompact")
    assert "before compaction 2" in undo["reply"]["content"]
    restored = (await (await client.get(f"{MAIN}/context")).json())["messages"]
    assert restored[1]["summary_id"] == records[0]["id"] and len(restored) > len(context_after_two)
    await post(client, "/uncompact")
    original = (await (await client.get(f"{MAIN}/context")).json())["messages"]
    assert original[1]["seq"] == 1
    assert all(m.get("kind") != "summary" for m in original[1:])
    assert (await post(client, "/uncompact"))["reply"]["content"].startswith("Nothing to undo")
    kinds = [r["type"] for r in jsonl(folder / "summaries.jsonl")]
    assert kinds == ["compaction", "compaction", "uncompact", "uncompact"]
    assert (await (await client.get(MAIN)).json())["compactions"] == 0


async def test_model_summaries_long_conversation_never_exceeds_the_window(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conversations.summarizer import ModelSummarizer

    splits: list[threading.Thread] = []  # the split of the messages into requests: off the event loop
    real_pieces = ModelSummarizer._pieces

    def pieces(self: ModelSummarizer, *args: Any) -> list[str]:
        splits.append(threading.current_thread())
        return real_pieces(self, *args)

    monkeypatch.setattr(ModelSummarizer, "_pieces", pieces)
    window = 3000
    overrides = {"agents": {"main": {"model": {"context_window": window, "max_output_tokens": 500}}}}
    openai_server.max_context_tokens = window - 500
    openai_server.add_rule(summary_rule)
    client = await aiohttp_client(make_app(tmp_path, clock, overrides, base_url=openai_server.base_url))
    bodies = [await post(client, f"turn {i}: " + "lorem ipsum dolor sit amet " * 12) for i in range(60)]
    assert all(b["reply"] is not None for b in bodies)
    assert all(r.prompt_tokens <= window - 500 for r in openai_server.chat_requests)
    folder = run_dir(tmp_path, bodies[0]["run_id"])
    messages = jsonl(folder / "messages.jsonl")
    assert len(messages) == 120 and [m["seq"] for m in messages] == list(range(1, 121))
    compactions = [s for s in jsonl(folder / "summaries.jsonl") if s["type"] == "compaction"]
    assert len(compactions) >= 2 and all(s["summarizer"] == "llm:test-model" for s in compactions)
    covered: list[int] = []
    for record in compactions:
        covered += list(range(record["start_seq"], record["end_seq"] + 1))
    assert covered == list(range(1, len(covered) + 1)), "each compacted seq range is covered exactly once"
    assert splits and all(t is not threading.main_thread() for t in splits)


async def test_overflow_forces_a_compaction_and_a_retry(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    openai_server.add_rule(summary_rule)
    client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    for i in range(20):
        await post(client, f"filler {i} " + "words " * 45, reply=False)
    openai_server.max_context_tokens = 1600  # the model's real window is smaller than configured (the tool
    # schemas, sessions_* tools included, count toward it)
    body = await post(client, "now answer")
    assert body["reply"]["content"] == "echo: now answer"
    assert [e["trigger"] for e in body["events"] if e["type"] == "compaction"] == ["overflow"]


async def test_overflow_that_compaction_cannot_fix_does_not_loop(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    openai_server.max_context_tokens = 10
    client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    resp = await client.post(f"{MAIN}/messages", json={"content": "x" * 400})
    assert resp.status == 502 and (await resp.json())["error"]["kind"] == "overflow"
    assert len(openai_server.chat_requests) <= 3


async def test_reset_successor_inherits_and_new_starts_clean(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    openai_server.add_rule(summary_rule)
    client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    first = await post(client, "my project is called Bluebird, ticket NT-42")
    await post(client, "/reset")
    final = await (await client.get(f"/v1/runs/{first['run_id']}/final-summary")).json()
    assert final["final_summary"].startswith("MODEL SUMMARY") and "llm:test-model" in final["final_summary"]
    second = await post(client, "what was my project?")
    inherited = [e for e in second["events"] if e["type"] == "inheritance"]
    assert inherited and inherited[0]["run_id"] == first["run_id"] and first["run_id"] in inherited[0]["comment"]
    sent = openai_server.chat_requests[-1].messages
    assert sent[1]["role"] == "system" and "MODEL SUMMARY" in sent[1]["content"]
    run = await (await client.get(f"/v1/runs/{second['run_id']}")).json()
    assert run["parent_uuid"] == first["run_id"]
    await post(client, "/new")
    third = await post(client, "fresh start")
    assert not [e for e in third["events"] if e["type"] == "inheritance"]
    assert [m["role"] for m in openai_server.chat_requests[-1].messages] == ["system", "user"]
    fourth_run = await post(client, "/reset")
    assert fourth_run["run_id"] == third["run_id"]
    fifth = await post(client, "after reset")
    assert [e["run_id"] for e in fifth["events"] if e["type"] == "inheritance"] == [third["run_id"]]


async def test_store_only_final_summary_is_extractive(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    first = await post(client, "remember the path /srv/data/2026 please")
    await client.post(f"{MAIN}/complete")
    final = await (await client.get(f"/v1/runs/{first['run_id']}/final-summary")).json()
    assert "/srv/data/2026" in final["final_summary"] and "extractive" in final["final_summary"]
    clock.advance(days=31)
    later = await post(client, "hello again")
    assert not [e for e in later["events"] if e["type"] == "inheritance"], "expired after inheritance.expiry_days"


@pytest.mark.parametrize("enabled", [True, False])
async def test_inheritance_can_be_turned_off(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, enabled: bool
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, {"inheritance": {"enabled": enabled}}))
    await post(client, "hello")
    await post(client, "/reset")
    again = await post(client, "hi")
    assert bool([e for e in again["events"] if e["type"] == "inheritance"]) is enabled


class HeldSummaries:
    """The store-only summary held on its worker thread: call n (1-based) of the first ``held``
    waits for ``release(n)``; ``calls`` records the thread of each call; with ``fail_first`` the
    first call raises once released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, held: int = 1, fail_first: bool = False) -> None:
        from sessions import compactor

        self.calls: list[threading.Thread] = []
        self.releases = [threading.Event() for _ in range(held)]
        real = compactor.extractive_summary

        def summary(*args: Any, **kwargs: Any) -> str:
            self.calls.append(threading.current_thread())
            number = len(self.calls)
            if number <= held:
                assert self.releases[number - 1].wait(30), "the test never released the summary"
                if fail_first and number == 1:
                    raise OSError("the summary failed")
            return real(*args, **kwargs)

        monkeypatch.setattr(compactor, "extractive_summary", summary)

    def release(self, number: int) -> None:
        self.releases[number - 1].set()

    def release_all(self) -> None:
        for event in self.releases:
            event.set()

    async def wait_for_calls(self, count: int) -> None:
        for _ in range(500):
            if len(self.calls) >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{len(self.calls)} summaries started, not {count}")


def held_client(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> Any:
    return aiohttp_client(make_app(tmp_path, clock, {"compaction": {"token_threshold": 1000}}))


async def post_until_held(client: Client, held: HeldSummaries, text: str) -> asyncio.Task[Any]:
    """Post ``text.format(i)`` for i = 0, 1, ... until one message brings a compaction due and its
    summary is held: that message's (unanswered) request; the others answered 200."""
    for i in range(40):
        task = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": text.format(i)}))
        while not task.done() and not held.calls:
            await asyncio.sleep(0.01)
        if held.calls:
            return task
        assert (await task).status == 200
    raise AssertionError("no message brought a compaction due")


async def body_of(request: asyncio.Task[Any]) -> dict[str, Any]:
    resp = await asyncio.wait_for(request, 30)
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def burst(client: Client, count: int, text: str) -> list[asyncio.Task[dict[str, Any]]]:
    """``count`` messages posted at once; they are answered without waiting for the compaction."""
    tasks = [asyncio.create_task(post(client, text.format(i))) for i in range(count)]
    await asyncio.wait(tasks, timeout=3)
    return tasks


async def context_under_threshold(client: Client) -> dict[str, Any]:
    """The key's context once a compaction brought it under the threshold (the check after a
    burst runs after the answers)."""
    for _ in range(500):
        context: dict[str, Any] = await (await client.get(f"{MAIN}/context")).json()
        if context["tokens"] < context["threshold"]:
            return context
        await asyncio.sleep(0.02)
    raise AssertionError(f"the context stays at {context['tokens']} of {context['threshold']} tokens")


LONG = "message {:02} " + "y" * 230  # about 60 tokens each
DURING = "during {:02} " + "z" * 230


async def test_messages_posted_during_an_automatic_compaction_do_not_wait_for_it(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store-only summary runs on a worker thread, and only the message that brought the
    compaction due waits for it: a busy key's other messages are answered meanwhile (they used to
    queue behind the compaction, and the summary ran on the event loop, stalling every key)."""
    held = HeldSummaries(monkeypatch)
    client = await held_client(aiohttp_client, tmp_path, clock)
    due = await post_until_held(client, held, "message number {0} about ticket #{0} " + "x" * 100)
    try:
        # The loop is free and the key takes more messages while the summary is held.
        later = [await asyncio.wait_for(post(client, f"during the compaction {i}"), 10) for i in range(3)]
        assert not due.done()
    finally:
        held.release_all()
    body = await body_of(due)
    assert [e["type"] for e in body["events"]] == ["compaction"]
    assert all(not b["events"] for b in later)
    assert held.calls and all(t is not threading.main_thread() for t in held.calls)
    folder = run_dir(tmp_path, body["run_id"])
    current = jsonl(folder / "current.jsonl")
    assert current[0]["kind"] == "summary"
    assert [m["content"] for m in current[-3:]] == [f"during the compaction {i}" for i in range(3)]


async def test_a_burst_during_an_automatic_compaction_is_compacted_too(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages posted while an automatic compaction runs do not wait for it, but the check after
    their append (SPEC section 5) still happens: when what they added keeps the new context at or
    over the threshold, it is compacted again before the key goes quiet, as when each of them
    waited for the compaction and checked after it."""
    held = HeldSummaries(monkeypatch)
    client = await held_client(aiohttp_client, tmp_path, clock)
    due = await post_until_held(client, held, LONG)
    try:
        during = await burst(client, 15, DURING)  # answered at once; stored in any case
    finally:
        held.release_all()
    await body_of(due)
    await asyncio.wait_for(asyncio.gather(*during), 30)
    context = await context_under_threshold(client)
    assert [m["content"][:9] for m in context["messages"][-15:]][-1] == "during 14"


async def recheck_held(client: Client, held: HeldSummaries) -> tuple[dict[str, Any], Any]:
    """A compaction held, a burst meanwhile, the compaction released: the check after the burst
    is then under way with its summary held (the second). The first message's answer and the
    conversations."""
    from gateway import keys as K

    due = await post_until_held(client, held, LONG)
    during = await burst(client, 15, DURING)
    held.release(1)
    body = await body_of(due)
    await asyncio.wait_for(asyncio.gather(*during), 30)
    await held.wait_for_calls(2)
    conv = client.server.app[K.CONVERSATIONS]
    assert conv._rechecks
    return body, conv


async def test_shutdown_waits_for_the_check_after_a_burst_and_leaves_no_marker(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compaction that checks again after a burst is no request: shutdown lets the pass under
    way end while the store is open, starts none, and leaves no compaction marker behind."""
    held = HeldSummaries(monkeypatch, held=2)
    client = await held_client(aiohttp_client, tmp_path, clock)
    try:
        body, conv = await recheck_held(client, held)
        closing = asyncio.create_task(conv.shutdown())
        await asyncio.sleep(0.2)
        assert not closing.done(), "shutdown waits for the compaction under way"
    finally:
        held.release_all()
    await asyncio.wait_for(closing, 30)
    assert not conv._compacting and not conv._rechecks
    folder = run_dir(tmp_path, body["run_id"])
    assert len([s for s in jsonl(folder / "summaries.jsonl") if s["type"] == "compaction"]) == 2
    assert sum(int(x.get("tokens", 0)) for x in jsonl(folder / "current.jsonl")) < 1000


async def test_a_burst_during_an_automatic_compaction_is_checked_when_the_gateway_shuts_down(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shutdown comes while the compaction runs that a burst of messages did not wait for: no task
    may take their check over then, so the message that waited makes it before it is answered
    (a graceful stop left the context at several times the threshold)."""
    from gateway import keys as K

    held = HeldSummaries(monkeypatch)
    client = await held_client(aiohttp_client, tmp_path, clock)
    conv = client.server.app[K.CONVERSATIONS]
    due = await post_until_held(client, held, LONG)
    try:
        during = await burst(client, 15, DURING)
        await asyncio.wait_for(conv.shutdown(), 10)  # the turn queue is closed; no message is taken now
    finally:
        held.release_all()
    body = await body_of(due)
    await asyncio.gather(*during)
    assert not conv._compacting and not conv._rechecks
    assert [e["type"] for e in body["events"]] == ["compaction", "compaction"]
    folder = run_dir(tmp_path, body["run_id"])
    assert sum(int(x.get("tokens", 0)) for x in jsonl(folder / "current.jsonl")) < 1000


async def test_messages_answered_during_a_failed_automatic_compaction_still_get_their_check(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the compaction they did not wait for fails, the messages answered meanwhile still get
    their threshold check (each of them, waiting, would have tried again): the context does not
    stay over the threshold until the key's next message."""
    held = HeldSummaries(monkeypatch, fail_first=True)
    client = await held_client(aiohttp_client, tmp_path, clock)
    due = await post_until_held(client, held, LONG)
    try:
        during = await burst(client, 3, "during {} " + "z" * 10)
    finally:
        held.release_all()
    failed = await asyncio.wait_for(due, 30)
    assert failed.status >= 500 and (await failed.json())["error"]["stored"] is True
    await asyncio.wait_for(asyncio.gather(*during), 30)
    await context_under_threshold(client)


async def test_a_reset_during_the_check_after_a_burst_waits_for_it_and_ends_the_run_whole(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/reset sent while the compaction after a burst runs its summary on a worker thread: the
    reset waits for it (the turn lock), the final summary reads the compacted context, every
    message is in the completed run, and the next message starts a new run with no marker left."""
    held = HeldSummaries(monkeypatch, held=2)
    client = await held_client(aiohttp_client, tmp_path, clock)
    try:
        first, conv = await recheck_held(client, held)
        reset = asyncio.create_task(post(client, "/reset"))
        await asyncio.sleep(0.2)
        assert not reset.done(), "the reset waits for the compaction under way"
    finally:
        held.release_all()
    body = await asyncio.wait_for(reset, 30)
    assert [e["type"] for e in body["events"]] == ["reset"]
    old = run_dir(tmp_path, first["run_id"])
    assert old.parent.name == "completed" and (old / "final_summary.txt").exists()
    summaries = [s for s in jsonl(old / "summaries.jsonl") if s["type"] == "compaction"]
    assert len(summaries) == 2
    messages = jsonl(old / "messages.jsonl")
    assert [m["seq"] for m in messages] == list(range(1, len(messages) + 1))
    assert sum(m["content"].startswith("during") for m in messages) == 15
    current = jsonl(old / "current.jsonl")
    kept = [m["seq"] for m in messages if m["seq"] > summaries[-1]["end_seq"] and not m.get("command")]
    assert current[0]["kind"] == "summary" and [m["seq"] for m in current[1:]] == kept  # none lost, none twice
    for _ in range(100):
        if not conv._compacting:
            break
        await asyncio.sleep(0.01)
    assert not conv._compacting and not conv._rechecks
    after = await post(client, "hello again")
    assert after["run_id"] != first["run_id"]
