"""``bench.key_spread``'s loads under wrk: the affine one posts each connection's requests to one
key, the spread one (``wrk_post_spread.lua``, paced or not) draws every request's key at random,
so each key's requests come over every connection; the report's commits per message."""

from __future__ import annotations

import collections
import shutil

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench.load import wrk_load


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (make test installs it as root)")
async def test_the_spread_load_sends_each_keys_requests_over_every_connection() -> None:
    seen: collections.defaultdict[object, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    async def record(request: web.Request) -> web.Response:
        await request.read()
        seen[request.transport.get_extra_info("peername") if request.transport else None][request.path] += 1
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/sessions/{key}/messages", record)
    async with TestServer(app, host="127.0.0.1") as server:
        assert server.port is not None
        common = {"connections": 4, "keys": 4, "prefix": "agent%3Amain%3As", "seconds": 1, "tag": "t"}
        await wrk_load(server.port, "affine", **common)  # type: ignore[arg-type]
        affine = dict(seen)
        seen.clear()
        await wrk_load(server.port, "spread", spread=True, **common)  # type: ignore[arg-type]
        spread = dict(seen)
        seen.clear()
        await wrk_load(server.port, "spread paced", spread=True, pause_ms=20, **common)  # type: ignore[arg-type]
        paced = dict(seen)
    assert all(len(paths) == 1 for paths in affine.values()), affine  # a connection, a key
    for load in (spread, paced):
        assert len(load) == 4, load
        assert all(len(paths) == 4 for paths in load.values()), load  # a connection, every key
        assert len({path for paths in load.values() for path in paths}) == 4, load
    assert sum(sum(paths.values()) for paths in paced.values()) < sum(sum(p.values()) for p in spread.values()) / 5


@pytest.mark.parametrize(
    ("rounds", "expected"),
    [
        ([(1000, 50.0)], 0.05),  # one round: its commits over its messages
        ([(1000, 50.0), (3000, 250.0)], 0.075),  # pooled over the rounds, not the rounds' mean (0.0667)
    ],
)
def test_the_report_gives_the_commits_per_message_pooled_over_the_rounds(
    rounds: list[tuple[int, float]], expected: float
) -> None:
    from bench.key_spread import Load, report, summary
    from bench.load import Phase
    from bench.workers_ingest import Case

    loads = {name: Load(name, Case(name, []), name.endswith("spread")) for name in ("pg x1 affine", "pg x1 spread")}
    for load in loads.values():
        for ok, committed in rounds:
            load.phases.append((Phase(load.name, ok, 0, 1.0, 0.01, 0.02, 0.01), 0.2, 0.1, committed))
    results = {name: summary(load) for name, load in loads.items()}
    assert results["pg x1 spread"][-1] == pytest.approx(expected)
    assert f"{expected:.3f} commits/msg" in report(results, 2)[0]
