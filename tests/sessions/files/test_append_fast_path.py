"""The append path's cheaper parts (issue 14): orjson-encoded message lines are the bytes json
wrote, lines are read back by orjson only where it gives json's value, and a caller cancelled
while it waits for its line leaves the line and the counters right (the writer settles them; no
``asyncio.shield`` per message any more)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from home import layout
from sessions.codec import decode, encode, encode_plain
from sessions.records import NewMessage
from tests.conftest import FakeClock
from tests.sessions.helpers import open_store, start

TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)  # no lone surrogates
SCALAR = st.one_of(TEXT, st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1))
PLAIN = st.recursive(
    SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=12
)


@settings(max_examples=300)
@given(st.dictionaries(TEXT, PLAIN, max_size=8))
def test_plain_records_are_encoded_to_the_same_bytes(record: dict[str, object]) -> None:
    assert encode_plain(record) == encode(record)


def test_every_code_point_is_encoded_to_the_same_bytes() -> None:
    points = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for first in range(0, len(points), 4096):
        text = "".join(points[first : first + 4096])
        assert encode_plain({"content": text, text[:8]: 1}) == encode({"content": text, text[:8]: 1})


def test_what_orjson_refuses_goes_through_json() -> None:
    assert encode_plain({"n": 2**70}) == encode({"n": 2**70})
    assert encode_plain({1: "int key"}) == encode({1: "int key"})  # type: ignore[dict-item]
    try:
        encode_plain({"content": "\ud800"})
    except UnicodeEncodeError:
        pass  # as encode raises: a lone surrogate cannot be stored
    else:
        raise AssertionError("a lone surrogate was encoded")


async def test_a_cancelled_wait_leaves_the_line_and_the_counters_right(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    run = await start(store)
    waits = [asyncio.create_task(store.append(run, NewMessage(role="user", content=f"m{i}"))) for i in range(20)]
    await asyncio.sleep(0)  # every append is queued (seq assigned) before the cancels
    for task in waits[::2]:
        task.cancel()
    results = await asyncio.gather(*waits, return_exceptions=True)
    assert sum(isinstance(r, asyncio.CancelledError) for r in results) == 10
    await store.writer.call(lambda: None)
    assert run.appends_pending == 0 and run.failed_seq is None and run.next_seq == 21
    folder = tmp_path / "contexts/running" / run.run_id
    stored = [json.loads(line) for line in (folder / layout.MESSAGES).read_text().splitlines()]
    assert [m["seq"] for m in stored] == list(range(1, 21))
    assert run.messages_bytes == (folder / layout.MESSAGES).stat().st_size
    assert run.context_bytes == (folder / layout.CURRENT).stat().st_size
    after = await store.append(run, NewMessage(role="user", content="next"))
    assert after["seq"] == 21
    await store.close()


ANY_SCALAR = st.one_of(
    st.text(max_size=30),  # lone surrogates too: json writes them escaped, orjson refuses to read them
    st.none(),
    st.booleans(),
    st.integers(),  # past 64 bits as well: orjson would read those as floats
    st.floats(),  # NaN and the infinities as well
)
ANY = st.recursive(
    ANY_SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)  # fmt: skip


def _same(a: object, b: object) -> bool:
    """Equal values of equal types (NaN equals NaN; 1 is not 1.0, -0.0 is not 0.0)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) and repr(a) == repr(b)


@settings(max_examples=500)
@given(ANY)
def test_lines_are_decoded_to_the_value_json_reads(value: object) -> None:
    for line in (encode({"v": value}), json.dumps({"v": value}).encode() + b"\n"):
        assert _same(decode(line), json.loads(line))


def test_what_orjson_reads_differently_or_refuses_goes_through_json() -> None:
    for line in (b'{"a": 123456789012345678901234567890}', b'{"a": -18446744073709551616}', b'{"a": NaN}',
                 b'{"a": -Infinity}', b'{"a": 1e400}', b'{"a": "\\ud800"}', b'{"a": "\xed\xa0\x80"}'):  # fmt: skip
        assert _same(decode(line), json.loads(line)), line
    for bad in (b'{"a": 1', b"\xff\xfe", b"", b"[1, 2"):
        with pytest.raises(ValueError):
            decode(bad)
