"""``neotask gateway --workers N``: N gateway processes on one port (postgres backend only).

The process ``neotask gateway`` starts is a small supervisor: it holds the home lock, reserves the
port (a socket bound with ``SO_REUSEPORT`` that never listens, so ``--port 0`` gives every worker
the same port), starts N workers (``python -m gateway.cli gateway`` with ``WORKER_ENV`` set: they
take no lock, write no ``gateway.json``, and listen with ``SO_REUSEPORT``: the kernel spreads the
connections), waits until each says it listens, then writes ``gateway.json`` (its own pid, the
URL) and prints where it listens. SIGTERM/SIGINT go to every worker (and ``neotask gateway stop``
works as for one process: it signals the pid in ``gateway.json`` and waits for the lock); SIGHUP is
forwarded (each worker reopens its log and reloads the configuration). A worker that dies
unexpectedly is started again after a backoff (doubling up to ``RESTART_MAX_S``, back to the
start once a worker has run ``STABLE_S``). Each worker exits when the supervisor dies
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from config.clock import iso, system_clock
from config.loader import LoadedConfig
from conversations.log_context import EVERY_ONE
from conversations.metrics import MULTIPROCESS_ENV
from gateway import eventloop, exits, systemd
from gateway.places import url_for, version
from home.atomic import write_json_atomic
from home.layout import Home

log = logging.getLogger(__name__)

WORKER_ENV = "_NEOTASK_WORKER"  # "<index>:<ready fd>" in a worker's environment (not a setting)
WORKERS_ENV = "NEOTASK_GATEWAY__WORKERS"  # the workers' count, so every worker's settings say it
RESTART_FIRST_S = 0.5
RESTART_MAX_S = 30.0
STABLE_S = 30.0
READY_TIMEOUT_S = 300.0  # a start on a loaded machine imports for a minute
KILL_MARGIN_S = 5.0  # past gateway.shutdown_timeout_s a worker that has not exited is killed
_PR_SET_PDEATHSIG = 1


def refusal(backend: str, workers: int) -> str | None:
    """The one line refusing ``workers`` processes on ``backend``; None when it may run."""
    if workers > 1 and backend != "postgres":
        return (
            f"--workers {workers} needs storage.backend: postgres (the {backend} backend is served by one"
            " process: its files and locks are that process's); run with --workers 1, or move the"
            " sessions to PostgreSQL (neotask storage copy --to postgres://...)"
        )
    return None


@dataclass(frozen=True)
class WorkerRole:
    """What a worker process was told by its supervisor."""

    index: int
    ready_fd: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WorkerRole | None:
        value = env.get(WORKER_ENV)
        if not value:
            return None
        index, _, fd = value.partition(":")
        return cls(int(index), int(fd))

    def ready(self) -> None:
        """Tell the supervisor this worker listens (once)."""
        with contextlib.suppress(OSError):
            os.write(self.ready_fd, b"ready\n")
            os.close(self.ready_fd)

    @staticmethod
    def die_with_parent() -> None:
        """SIGTERM this process when the supervisor dies (Linux), so no worker outlives it."""
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() == 1:  # the supervisor died before the call above
            os.kill(os.getpid(), signal.SIGTERM)


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT`` that never listens: it fixes the port
    (``0``: a free one) for the workers, which bind it too and listen."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass(eq=False)
class Worker:
    index: int
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    restarts: int = 0
    backoff: float = RESTART_FIRST_S
    ready: asyncio.Future[bool] | None = None
    history: list[int] = field(default_factory=list)  # exit statuses, oldest first


class Supervisor:
    def __init__(self, config: LoadedConfig, *, host: str, port: int, count: int, env: Mapping[str, str]) -> None:
        self.config = config
        self.home = Home(config.home)
        self.host, self.port, self.count = host, port, count
        self.env = dict(env)
        self.workers = [Worker(i) for i in range(1, count + 1)]
        self.metrics = self.home.root / "workers" / "metrics"  # the fleet's counts (conversations/metrics.py)
        self.stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def _argv(self) -> list[str]:
        argv = [sys.executable, "-m", "gateway.cli", "gateway", "--home", str(self.home.root)]
        if self.config.config_path is not None:
            argv += ["--config", str(self.config.config_path)]
        return [*argv, "--host", self.host, "--port", str(self.port)]

    async def spawn(self, worker: Worker) -> None:
        read_fd, write_fd = os.pipe()
        env = {**self.env, WORKER_ENV: f"{worker.index}:{write_fd}", WORKERS_ENV: str(self.count),
               MULTIPROCESS_ENV: str(self.metrics)}  # fmt: skip
        try:
            worker.proc = await asyncio.create_subprocess_exec(
                *self._argv(), env=env, pass_fds=(write_fd,), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            os.close(write_fd)
        worker.started = time.monotonic()
        loop = asyncio.get_running_loop()
        worker.ready = loop.create_future()

        async def wait_ready(future: asyncio.Future[bool]) -> None:
            try:
                said = await asyncio.to_thread(os.read, read_fd, 64)
            finally:
                os.close(read_fd)
            if not future.done():
                future.set_result(said.startswith(b"ready"))

        self._track(loop.create_task(wait_ready(worker.ready)))
        log.info("worker %d started (pid %d)", worker.index, worker.proc.pid, extra=EVERY_ONE)  # each is written

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def watch(self, worker: Worker) -> None:
        """Start ``worker`` again whenever it dies while the supervisor is not stopping."""
        while True:
            assert worker.proc is not None
            status = await worker.proc.wait()
            worker.history.append(status)
            await asyncio.to_thread(_forget_gauges, self.metrics, worker.proc.pid)
            if self.stopping.is_set():
                return
            ran = time.monotonic() - worker.started
            if ran >= STABLE_S:
                worker.backoff = RESTART_FIRST_S
            log.warning(
                "worker %d (pid %d) exited with status %d after %.1f s: starting it again in %.1f s",
                worker.index, worker.proc.pid, status, ran, worker.backoff, extra=EVERY_ONE,
            )  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), worker.backoff)
            if self.stopping.is_set():
                return
            worker.backoff = min(worker.backoff * 2, RESTART_MAX_S)
            worker.restarts += 1
            await self.spawn(worker)

    def signal_all(self, signum: int) -> None:
        for worker in self.workers:
            if worker.proc is not None and worker.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.send_signal(signum)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()

        def on_stop(signum: int) -> None:
            if not self.stopping.is_set():
                log.info("%s: stopping %d workers", signal.Signals(signum).name, self.count)
            self.stopping.set()
            systemd.stopping(self.env)
            self.signal_all(signal.SIGTERM)

        def on_hangup() -> None:
            log.info("SIGHUP: forwarded to %d workers", self.count)
            self.signal_all(signal.SIGHUP)

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_stop, signum)
        loop.add_signal_handler(signal.SIGHUP, on_hangup)
        watchers: list[asyncio.Task[None]] = []
        await asyncio.to_thread(_fresh_folder, self.metrics)  # counts start at zero with the fleet
        try:
            for worker in self.workers:
                await self.spawn(worker)
            for worker in self.workers:
                assert worker.ready is not None and worker.proc is not None
                ready = asyncio.ensure_future(worker.ready)
                exited = asyncio.ensure_future(worker.proc.wait())
                stop = asyncio.ensure_future(self.stopping.wait())
                await asyncio.wait((ready, exited, stop), timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
                for pending in (exited, stop):
                    pending.cancel()
                if self.stopping.is_set():
                    return await self._stop_all(0)
                if not (ready.done() and ready.result()):
                    log.error("worker %d did not start (see the lines above); stopping the others", worker.index)
                    status = None  # a bad configuration or a refused database: the supervisor exits as it did
                    with contextlib.suppress(TimeoutError):
                        status = await asyncio.wait_for(worker.proc.wait(), KILL_MARGIN_S)
                    return await self._stop_all(status if status in (exits.CONFIG, exits.STATE) else 1)
            watchers = [loop.create_task(self.watch(w)) for w in self.workers]
            url = _url(self.host, self.port)
            info = {
                "pid": os.getpid(),
                "url": url,
                "started_at": iso(system_clock()),
                "home": str(self.home.root),
                "config_path": str(self.config.config_path.absolute()) if self.config.config_path else None,
                "version": version(),
                "workers": self.count,
            }
            await asyncio.to_thread(write_json_atomic, self.home.gateway_json, info)
            print(f"neotask gateway listening on {url} (home {self.home.root}, {self.count} workers)", flush=True)
            log.info("listening on %s with %d workers (supervisor pid %d)", url, self.count, os.getpid())
            systemd.ready(self.env, url)
            await self.stopping.wait()
            return await self._stop_all(0)
        finally:
            for task in watchers:
                task.cancel()
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(signum)
            await asyncio.to_thread(_remove, self.home.gateway_json)

    async def _stop_all(self, status: int) -> int:
        """SIGTERM every worker, wait (killing one that outlives its shutdown timeout); the exit
        status: ``status``, or 1 when a worker did not stop cleanly."""
        self.stopping.set()
        self.signal_all(signal.SIGTERM)
        deadline = self.config.settings.gateway.shutdown_timeout_s + KILL_MARGIN_S
        for worker in self.workers:
            if worker.proc is None:
                continue
            try:
                code = await asyncio.wait_for(worker.proc.wait(), deadline)
            except TimeoutError:
                log.error("worker %d (pid %d) did not stop: killed", worker.index, worker.proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.kill()
                code = await worker.proc.wait()
            if code != 0:
                status = status or 1
        log.info("stopped %d workers", self.count)
        return status


def _fresh_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, mode=0o700)


def _forget_gauges(folder: Path, pid: int) -> None:
    """A dead worker's gauges leave the fleet's (its counters stay: the totals survive it)."""
    for path in folder.glob(f"gauge_live*_{pid}.db"):
        path.unlink(missing_ok=True)


def run_supervisor(config: LoadedConfig, *, host: str, port: int, count: int, env: Mapping[str, str]) -> int:
    """Run ``count`` workers until SIGTERM/SIGINT (the caller holds the home lock)."""
    try:
        reserved = reserve_port(host, port)
    except OSError as exc:
        print(f"error: cannot listen on {host} port {port}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 1
    with reserved:
        bound = int(reserved.getsockname()[1])
        supervisor = Supervisor(config, host=host, port=bound, count=count, env=env)
        return eventloop.run(supervisor.run(), "asyncio")


def _url(host: str, port: int) -> str:
    return url_for(host, port)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
