"""``gateway.handoff`` on real sockets in one process: every key has one owner among N workers, a
post for another worker's key is run there and its answer (or its refusal, as the same error) comes
back; an owner that is not listening leaves the post to the worker that took it; an owner that dies
with a post under way is reported as "may be stored" (no ``stored``); an owner that closes answers
what it had and declines the rest; a streamed post's deltas come as they are made; each outcome is
counted (``neotask_handoffs_total{result}``)."""

from __future__ import annotations

import asyncio
import collections
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from config.errors import SessionPaused, StorageUnavailable
from conversations.metrics import Metrics
from conversations.posts import DeltaFn, Post
from gateway import handoff as H
from gateway.handoff import Handoff, owner_of
from gateway.handoff_frames import Frames, decode_post, encode_post, frame_of
from gateway.http import retry_headers
from sessions.keys import parse_key
from sessions.records import NewMessage, TaskKey


def post_for(raw: str, text: str = "hello") -> Post:
    message = NewMessage(role="user", content=text, name="Zoë", client_message_id="c-1", tool_calls=({"id": "x"},))
    return Post(parse_key(raw, agents={"main"}), message, reply=False, task_key=TaskKey("dm", raw))


def key_owned_by(index: int, workers: int = 2, *, start: int = 0) -> str:
    for n in range(start, start + 1000):
        raw = f"agent:main:dm:u{n}"
        if owner_of(raw, workers) == index:
            return raw
    raise AssertionError("no key")


class Worker:
    """A worker's hand-off side and what its ``handle`` ran."""

    def __init__(self, home: Path, index: int, workers: int = 2, *, one_owner: bool = False) -> None:
        self.ran: list[Post] = []
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None
        self.deltas: tuple[str, ...] = ()  # what a streamed post sends before its answer
        self.counts: collections.Counter[str] = collections.Counter()
        self.side = Handoff(home, os.getpid(), index, workers, self.handle, self.count, one_owner=one_owner)

    def count(self, result: str) -> None:
        self.counts[result] += 1

    async def handle(self, post: Post, on_delta: DeltaFn | None) -> Mapping[str, Any]:
        self.ran.append(post)
        for n, text in enumerate(self.deltas):
            assert on_delta is not None, "a streamed post was handed over without its deltas"
            await on_delta(text)
            if n == 0 and self.gate is not None:
                await self.gate.wait()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return {"session_key": post.key.raw, "message_seq": len(self.ran), "by": self.side.index}


@pytest.fixture
async def pair(tmp_path: Path) -> Any:
    one, two = Worker(tmp_path, 1), Worker(tmp_path, 2)
    await one.side.start()
    await two.side.start()
    yield one, two
    await one.side.close()
    await two.side.close()


def test_every_key_has_one_owner_and_the_keys_spread() -> None:
    keys = [f"agent:main:dm:u{n}" for n in range(2000)]
    for workers in (2, 3, 5):
        owners = collections.Counter(owner_of(key, workers) for key in keys)
        assert sorted(owners) == list(range(1, workers + 1))
        assert min(owners.values()) > 0.7 * len(keys) / workers, owners
    remembered = [owner_of(key, 3) for key in keys]
    H._OWNERS.clear()  # what another process computes afresh
    assert [owner_of(key, 3) for key in keys] == remembered


def test_a_post_crosses_as_it_was_built() -> None:
    def crossed(post: Post) -> Post:
        return decode_post(orjson.loads(orjson.dumps(encode_post(post))))

    post = post_for("agent:main:telegram:group:g1:topic:7", "日本語 and ünïcode")
    assert crossed(post) == post
    hook = Post(parse_key("hook:gh:push:1", agents={"main"}), NewMessage(role="user", content="x"), reply=True)
    assert crossed(hook) == hook


async def test_frames_cut_anywhere_by_the_reads_come_whole() -> None:
    frames = [{"id": n, "body": "é" * n} for n in range(40)]
    wire = b"".join(frame_of(f) for f in frames)
    reader = asyncio.StreamReader()
    got: list[dict[str, Any]] = []
    reading = Frames(reader)

    async def feed() -> None:
        for at in range(0, len(wire), 7):  # 7 bytes at a time: lengths and bodies cut everywhere
            reader.feed_data(wire[at : at + 7])
            await asyncio.sleep(0)
        reader.feed_eof()

    feeding = asyncio.create_task(feed())
    while len(got) < len(frames):
        got += await asyncio.wait_for(reading.next(), 5)
    await feeding
    assert got == frames
    with pytest.raises(asyncio.IncompleteReadError):
        await reading.next()


async def test_a_post_for_another_workers_key_is_answered_by_that_worker(pair: tuple[Worker, Worker]) -> None:
    one, two = pair
    theirs, mine = post_for(key_owned_by(2)), post_for(key_owned_by(1))
    body = await one.side.post(theirs)
    assert body == {"session_key": theirs.key.raw, "message_seq": 1, "by": 2}
    assert two.ran == [theirs] and one.ran == []  # the post as the route built it, run by its owner
    assert await one.side.post(mine) is None  # its own key: answered where it came
    assert await two.side.post(theirs) is None
    many = [post_for(key_owned_by(1, start=n * 50), f"m{n}") for n in range(20)]
    answers = await asyncio.gather(*(two.side.post(p) for p in many))  # one connection, answers matched
    assert [a["session_key"] for a in answers if a] == [p.key.raw for p in many]
    assert one.side.server.handled == 20 and two.side.handed == 20
    assert one.counts == {"answered": 1, "served": 20} and two.counts == {"answered": 20, "served": 1}


async def test_with_one_owner_worker_1_answers_every_key(tmp_path: Path) -> None:
    """``gateway.key_owner: first``: every post taken by another worker goes to worker 1, whatever
    its key's hash; worker 1 answers its own posts itself."""
    one, two, three = (Worker(tmp_path, i, 3, one_owner=True) for i in (1, 2, 3))
    for worker in (one, two, three):
        await worker.side.start()
    try:
        posts = [post_for(key_owned_by(owner, 3), f"to {owner}") for owner in (1, 2, 3)]
        for taker in (two, three):
            answers = await asyncio.gather(*(taker.side.post(p) for p in posts))
            assert [a["by"] for a in answers if a] == [1, 1, 1]
        assert [await one.side.post(p) for p in posts] == [None, None, None]
        assert one.ran == posts * 2 and two.ran == [] and three.ran == []
    finally:
        for worker in (one, two, three):
            await worker.side.close()


async def test_the_owners_refusal_comes_back_as_the_same_error(pair: tuple[Worker, Worker]) -> None:
    one, two = pair
    two.fail = StorageUnavailable("the database is away: nothing was stored", stored=False, retry_after_s=2)
    with pytest.raises(StorageUnavailable) as caught:
        await one.side.post(post_for(key_owned_by(2)))
    assert caught.value.status == 503 and caught.value.message == "the database is away: nothing was stored"
    assert caught.value.extra == {"stored": False, "retry_after_s": 2}
    assert retry_headers(caught.value) == {"Retry-After": "2"}
    two.fail = SessionPaused("the session is paused")
    with pytest.raises(SessionPaused) as full:
        await one.side.post(post_for(key_owned_by(2)))
    assert full.value.status == SessionPaused.status and full.value.code == SessionPaused.code
    two.fail = RuntimeError("a bug")
    with pytest.raises(Exception) as bug:
        await one.side.post(post_for(key_owned_by(2)))
    assert type(bug.value).__name__ == "NeotaskError" and "a bug" in str(bug.value)
    assert one.counts == {"refused": 3} and two.counts == {}


async def test_an_owner_not_listening_leaves_the_post_where_it_came(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = Worker(tmp_path, 1), Worker(tmp_path, 2)
    await one.side.start()
    try:
        post = post_for(key_owned_by(2))
        assert await one.side.post(post) is None  # worker 2 starting again: stored here
        await two.side.start()
        assert await one.side.post(post) is None  # not asked again within DOWN_S
        monkeypatch.setattr(H, "DOWN_S", 0.0)
        one.side._owners[2].down_until = 0.0
        assert (await one.side.post(post) or {}).get("by") == 2
        assert one.counts == {"unreachable": 2, "answered": 1}
    finally:
        await one.side.close()
        await two.side.close()


async def test_an_owner_that_dies_with_a_post_under_way_says_it_may_be_stored(pair: tuple[Worker, Worker]) -> None:
    one, two = pair
    two.gate = asyncio.Event()
    under_way = asyncio.create_task(one.side.post(post_for(key_owned_by(2))))
    while not two.ran:
        await asyncio.sleep(0.01)
    for writer in list(two.side.server._writers):  # the process killed: its connections reset
        writer.transport.abort()
    with pytest.raises(StorageUnavailable) as caught:
        await under_way
    assert "stored" not in caught.value.extra and "same client_message_id" in caught.value.message
    assert await one.side.post(post_for(key_owned_by(2))) is None  # meanwhile stored here
    assert one.counts == {"lost": 1, "unreachable": 1}
    two.gate.set()


async def test_an_owner_shutting_down_answers_what_it_had_and_declines_the_rest(
    pair: tuple[Worker, Worker],
) -> None:
    one, two = pair
    two.gate = asyncio.Event()
    first = asyncio.create_task(one.side.post(post_for(key_owned_by(2))))
    while not two.ran:
        await asyncio.sleep(0.01)
    closing = asyncio.create_task(two.side.server.close())
    await asyncio.sleep(0.05)
    assert await one.side.post(post_for(key_owned_by(2, start=500))) is None  # declined: stored here
    assert len(two.ran) == 1
    two.gate.set()
    assert (await first or {}).get("by") == 2
    await closing
    assert one.counts == {"declined": 1, "answered": 1}


def test_the_hand_off_works_on_uvloop_as_the_daemon_runs_it(tmp_path: Path) -> None:
    """The daemon's loop is uvloop, which refuses an abstract socket name given as a path."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> dict[str, Any] | None:
        one, two = Worker(tmp_path, 1), Worker(tmp_path, 2)
        await one.side.start()
        await two.side.start()
        try:
            return await one.side.post(post_for(key_owned_by(2)))
        finally:
            await one.side.close()
            await two.side.close()

    assert (uvloop.run(scenario()) or {}).get("by") == 2


async def test_a_post_the_frame_cannot_carry_is_stored_where_it_came(pair: tuple[Worker, Worker]) -> None:
    one, two = pair
    raw = key_owned_by(2)
    huge = Post(parse_key(raw, agents={"main"}), NewMessage(role="tool", content="x", tool_calls=({"n": 1 << 70},)))
    assert await one.side.post(huge) is None and two.ran == []
    assert one.counts == {"unsendable": 1}


async def test_a_streamed_post_gets_its_deltas_as_the_owner_makes_them(pair: tuple[Worker, Worker]) -> None:
    one, two = pair
    two.deltas, two.gate = ("Hel", "lo ", "日本"), asyncio.Event()
    got: list[str] = []

    async def on_delta(text: str) -> None:
        got.append(text)

    theirs = post_for(key_owned_by(2))
    streamed = asyncio.create_task(one.side.post(theirs, on_delta))
    while not got:  # the first delta arrives while the owner still works on the post
        await asyncio.sleep(0.01)
    assert got == ["Hel"] and not streamed.done()
    two.gate.set()
    assert (await streamed or {}).get("by") == 2
    assert got == ["Hel", "lo ", "日本"] and two.ran == [theirs]
    assert await one.side.post(post_for(key_owned_by(1)), on_delta) is None  # its own key: answered here
    assert one.counts == {"answered": 1} and two.counts == {"served": 1}


async def test_an_owner_that_dies_mid_stream_fails_the_stream_with_may_be_stored(pair: tuple[Worker, Worker]) -> None:
    one, two = pair
    two.deltas, two.gate = ("a", "b"), asyncio.Event()
    got: list[str] = []

    async def on_delta(text: str) -> None:
        got.append(text)

    streamed = asyncio.create_task(one.side.post(post_for(key_owned_by(2)), on_delta))
    while not got:
        await asyncio.sleep(0.01)
    for writer in list(two.side.server._writers):
        writer.transport.abort()
    with pytest.raises(StorageUnavailable) as caught:
        await streamed
    assert got == ["a"] and "stored" not in caught.value.extra and one.counts == {"lost": 1}
    two.gate.set()


def test_the_hand_off_counts_are_in_the_metrics() -> None:
    metrics = Metrics()
    for result in ("answered", "answered", "unreachable", "served"):
        metrics.handoff(result)
    text = metrics.render().decode()
    assert 'neotask_handoffs_total{result="answered"} 2.0' in text
    assert 'neotask_handoffs_total{result="unreachable"} 1.0' in text
    assert "neotask_handoffs_served_total 1.0" in text
    metrics.handoff("refused")
    assert metrics.registry.get_sample_value("neotask_handoffs_total", {"result": "refused"}) is None
    metrics.flush()  # a worker's timer counts between scrapes (the other workers' scrapes read it)
    assert metrics.registry.get_sample_value("neotask_handoffs_total", {"result": "refused"}) == 1


async def test_the_benchs_hop_measure_hands_every_post_to_the_owner() -> None:
    from bench.key_spread import hop_cost  # its own check: the owner served every post it timed

    assert 0 < await hop_cost(posts=128, rounds=1, warm=1) < 0.05


async def test_a_client_gone_mid_stream_is_not_the_owner_lost(pair: tuple[Worker, Worker]) -> None:
    one, two = pair
    two.deltas = ("a", "b")

    async def gone(text: str) -> None:
        raise ConnectionResetError("the client went away")

    with pytest.raises(ConnectionResetError):  # as on one process: the write's error, not a 503
        await one.side.post(post_for(key_owned_by(2)), gone)
    assert one.counts == {} and len(two.ran) == 1
    two.deltas = ()
    assert (await one.side.post(post_for(key_owned_by(2))) or {}).get("by") == 2  # the connection serves on
