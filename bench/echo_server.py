"""The floor of ``bench.workers_ingest``: a bare aiohttp server answering the gateway's message
route with no Neotask behind it, in one process or in N sharing one port with ``SO_REUSEPORT``, so
the bench can measure what this machine charges for a second process when there is nothing to
share (no store, no leases, no database).

``python -m bench.echo_server [--port P] [--workers N] [--loop auto|asyncio|uvloop]``

Each ``POST /v1/sessions/{key}/messages`` reads the body, decodes its JSON and answers a small
JSON ack (200, as the gateway's store-only answer). With ``--workers 1`` the process serves by
itself; above 1 it is a supervisor as the gateway's (``gateway/workers.py``): it binds the port
with ``SO_REUSEPORT`` without listening (``--port 0``: a free one), starts N serving processes
on it, waits until each listens, then prints ``listening on http://HOST:PORT`` (the gateway's
line) and waits; SIGTERM or SIGINT stop it and its workers. Every process exits with its parent
(``PR_SET_PDEATHSIG``). Not a benchmark module by itself (no ``main``): the bench starts it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from gateway import eventloop

HOST = "127.0.0.1"
READY_TIMEOUT_S = 120.0
_PR_SET_PDEATHSIG = 1


PID = web.AppKey("pid", int)


async def _ack(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    stored = {"session_key": request.match_info["key"], "stored": True, "length": len(body.get("content", ""))}
    return web.json_response({**stored, "pid": request.app[PID]})


def app() -> web.Application:
    served = web.Application()
    served[PID] = os.getpid()
    served.router.add_post("/v1/sessions/{key}/messages", _ack)
    return served


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


async def _serve(port: int, reuse_port: bool) -> None:
    runner = web.AppRunner(app(), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, HOST, port, reuse_port=reuse_port, backlog=1024).start()
    print(f"listening on http://{HOST}:{runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def _supervise(port: int, workers: int, loop: str) -> int:
    """N serving processes on one port (the gateway's ``--workers`` shape, minus the gateway)."""
    reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    reserved.bind((HOST, port))
    port = reserved.getsockname()[1]
    argv = [sys.executable, "-m", "bench.echo_server", "--port", str(port), "--loop", loop, "--reuse-port"]
    root = Path(__file__).resolve().parents[1]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=root, text=True)
        for _ in range(workers)
    ]
    stopping: list[int] = []

    def stop_workers() -> None:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    def on_stop(signum: int, _frame: object) -> None:
        stopping.append(signum)
        stop_workers()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    try:
        for proc in procs:  # each says it listens (the supervisor's stdout only says so once all do)
            assert proc.stdout is not None
            if not proc.stdout.readline().startswith("listening on "):
                raise RuntimeError(f"echo worker {proc.pid} exited before listening")
        print(f"listening on http://{HOST}:{port}", flush=True)
        while not stopping and all(proc.poll() is None for proc in procs):
            time.sleep(0.5)
    finally:
        stop_workers()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reserved.close()
    return 0 if stopping else 1  # a worker that died by itself fails the supervisor


def serve(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.echo_server", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)  # a supervisor's worker
    args = parser.parse_args(argv)
    _die_with_parent()
    if args.workers > 1:
        return _supervise(args.port, args.workers, args.loop)
    eventloop.run(_serve(args.port, args.reuse_port), args.loop)
    return 0


if __name__ == "__main__":
    sys.exit(serve())
