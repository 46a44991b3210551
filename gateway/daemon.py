"""Running the gateway as a process (SPEC section 2, start-up order and SIGTERM).

Order: take the home lock (a second daemon exits 73 before loading anything), refuse a public
address without tokens, build the app and open its cleanup contexts (the store recovers every
active run), bind, and only then write ``gateway.json`` and print where it listens. SIGTERM or
SIGINT: stop accepting, let in-flight requests finish, close the cleanup contexts (sessions.json
flushed), remove ``gateway.json``, release the lock, exit 0. SIGHUP reopens the log file (after a
log rotator moved it) and reloads the configuration (``gateway/reload.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.handlers
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from config.clock import iso, system_clock
from config.errors import ConfigError, DatabaseRefused
from config.loader import LoadedConfig
from config.redaction import SECRETS
from config.settings import LoggingSettings
from conversations.commands import dispatch
from conversations.metrics import STORED_EVERY_S
from conversations.posts import DeltaFn, Post
from gateway import eventloop, exits, reload, systemd
from gateway import keys as K
from gateway.app import create_app
from gateway.connections import GUARD, GuardedSite, connection_limits
from gateway.fleet import Fleet
from gateway.handoff import Handoff
from gateway.heap import settle_heap
from gateway.hosts import bind_address
from gateway.log_json import ContextFilter, JsonFormatter
from gateway.logs import LogListener, RedactFilter, RepeatFilter, file_handler
from gateway.places import url_for, version
from gateway.runner import JsonErrorsAppRunner
from gateway.validation import check_listening
from gateway.workers import WorkerRole, run_supervisor
from home.atomic import write_json_atomic
from home.damage import EXIT_STATE, DamagedState, check_writable, storage_damage
from home.layout import Home
from home.lock import EXIT_LOCKED, HomeLock, HomeLocked
from home.permissions import tighten_root
from sessions.backends import describe_backend

log = logging.getLogger(__name__)
QUIET_LOGGERS = ("apscheduler", "httpx", "httpx2", "openai", "sentence_transformers")

EXIT_FAILED = exits.FAILED
EXIT_REFUSED = exits.CONFIG  # a public address without tokens: the configuration must change
CLEANUP_RESERVE_S = 2.0  # of gateway.shutdown_timeout_s, kept for closing the store after requests
WATCHDOG_MARGIN_S = 0.25  # the process is forced out this long before gateway.shutdown_timeout_s
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def describe_models(config: LoadedConfig) -> str:
    models = [
        agent.model.name if agent_id == "main" else f"{agent_id}={agent.model.name}"
        for agent_id, agent in config.settings.agents.items()
        if agent.model.base_url
    ]
    return f"model {', '.join(models)}" if models else "store-only"


def run_daemon(
    config: LoadedConfig,
    *,
    host: str | None,
    port: int | None,
    env: Mapping[str, str],
    lock: HomeLock | None = None,
    workers: int = 1,
) -> int:
    """Run the gateway until SIGTERM or SIGINT; the process's exit status. ``lock`` is the home
    lock when the caller took it already (before loading the configuration). ``workers`` above 1:
    this process supervises that many workers (``gateway/workers.py``). A worker (``WORKER_ENV``
    set by its supervisor, which holds the lock) takes no lock and records no exit."""
    home = Home(config.home)
    role = WorkerRole.from_env(env)
    if role is not None:
        role.die_with_parent()
        return _run_locked(config, home, host=host, port=port, env=env, role=role)
    if lock is None:
        lock = HomeLock(home.lock_file)
        try:
            lock.acquire()
        except HomeLocked as exc:
            print(exc.message, file=sys.stderr, flush=True)
            return EXIT_LOCKED
    status = EXIT_FAILED
    try:
        status = _run_locked(config, home, host=host, port=port, env=env, workers=workers)
        return status
    finally:
        record_exit(home, status)
        lock.release()


def _run_locked(
    config: LoadedConfig,
    home: Home,
    *,
    host: str | None,
    port: int | None,
    env: Mapping[str, str],
    workers: int = 1,
    role: WorkerRole | None = None,
) -> int:
    """``run_daemon`` once the home lock is held (by this process, or by a worker's supervisor)."""
    try:
        check_writable(home.root)
        if home.contexts.is_dir():  # a mount of its own can be read-only under a writable home
            check_writable(home.contexts)
        widened = tighten_root(home.root)  # a home made 0755 by the user's umask: private now
        if role is None:
            _remove(home.gateway_json)  # left by a daemon that was killed: we hold the lock now
    except DamagedState as exc:
        print(f"error: {exc.message}", file=sys.stderr, flush=True)
        return EXIT_STATE
    gateway = config.settings.gateway
    bind_host = bind_address(host if host is not None else gateway.host)
    bind_port = port if port is not None else gateway.port
    try:
        check_listening(gateway.tokens, bind_host)
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    with _logging_to(home, config.settings.logging) as reopen_log:
        log.info(
            "neotask %s starting: home %s, backend %s, config %s",
            version(),
            home.root,
            describe_backend(config.settings),
            config.config_path or "defaults and environment (no config file)",
        )
        for warning in config.warnings if role is None else ():
            log.warning(warning)
        if widened is not None:
            log.warning(
                "the home %s was mode %04o (readable by other users): now %04o", home.root, widened, widened & 0o700
            )
        if workers > 1:
            return run_supervisor(config, host=bind_host, port=bind_port, count=workers, env=env)
        try:
            return eventloop.run(_serve(config, bind_host, bind_port, env, reopen_log, role), gateway.event_loop)
        finally:
            # Shut down already: a repeated signal while the process exits must not kill it.
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, signal.SIG_IGN)


def record_exit(home: Home, status: int, reason: str | None = None) -> None:
    """``logs/exit.json``: how this daemon ended (``neotask gateway stop`` reports it), written
    before the lock is released. A home that cannot be written keeps none."""
    record = {"pid": os.getpid(), "status": status, "reason": reason, "at": iso(system_clock())}
    with contextlib.suppress(OSError):
        home.logs.mkdir(parents=True, exist_ok=True)
        write_json_atomic(home.logs / exits.EXIT_RECORD, record)


async def _serve(
    config: LoadedConfig,
    host: str,
    port: int,
    env: Mapping[str, str],
    reopen_log: Callable[[], None],
    role: WorkerRole | None = None,
) -> int:
    home = Home(config.home)
    stop = asyncio.Event()
    app = create_app(config, clock=system_clock, env=env)  # nothing opens before runner.setup()
    handoff = _join_fleet(app, home, config, role)
    signals = _Signals(app, home, env, reopen_log, role, stop, config.settings.gateway.shutdown_timeout_s)
    signals.install(asyncio.get_running_loop())
    runner = _runner(app, config)
    try:
        failed = await _setup(runner)
        if failed is not None:
            return failed
        if handoff is not None:
            await handoff.start()
        site = GuardedSite(runner, host, port, app[GUARD], reuse_port=role is not None)
        try:
            await site.start()
        except OSError as exc:
            log.error("cannot listen on %s port %d: %s", host, port, exc.strerror or exc)
            return EXIT_FAILED
        bound_port = _bound_port(runner.addresses, port)
        signals.url = url_for(host, bound_port)
        await _announce(config, home, host, bound_port, env, role)
        settle_heap()  # start-up is done (and timed): the collector stops walking what it made
        if role is not None:  # the other workers read this worker's counts and status
            await _tick_for_fleet(app, stop)
        await stop.wait()
    finally:
        status = await _cleanup(runner, home)
        if handoff is not None:
            await handoff.close()
        if role is None:
            await asyncio.to_thread(_remove, home.gateway_json)
    log.info("stopped" if status == 0 else "stopped without saving everything")
    return status


def _join_fleet(app: web.Application, home: Home, config: LoadedConfig, role: WorkerRole | None) -> Handoff | None:
    """A worker of several: a reload through the API reaches every worker, and (``key_handoff``)
    a key's posts go to the worker owning it, through the handoff this returns."""
    if role is None:
        return None
    fleet = app[reload.RELOADS].fleet = Fleet.of(home.root, role.index, config.settings.gateway.workers)
    if not (config.settings.gateway.key_handoff and fleet.count > 1):
        return None
    handoff = app[K.HANDOFF] = Handoff(home.root, fleet.supervisor, fleet.index, fleet.count,
                                       lambda post, on_delta: _run_handed(app, post, on_delta),
                                       lambda result: app[K.METRICS].handoff(result),
                                       one_owner=config.settings.gateway.key_owner == "first")  # fmt: skip
    app.on_shutdown.append(_stop_taking_posts)  # after the turns are stopped, before the store closes
    return handoff


async def _setup(runner: web.AppRunner) -> int | None:
    """Open the app (its cleanup contexts: the store recovers every active run); the exit status
    when it cannot start, else None."""
    try:
        await runner.setup()
    except (DamagedState, DatabaseRefused) as exc:
        log.error("cannot start: %s", exc.message)
        return EXIT_STATE
    except ConfigError as exc:  # checked before start already; a check made while building
        log.error("cannot start: %s", exc.message)
        return exits.CONFIG
    return None


@dataclass
class _Signals:
    """The daemon's signal handlers: SIGTERM and SIGINT shut it down (a second one is logged and
    ignored), SIGHUP reopens the log file and reloads the configuration (its default action would
    end the process). ``url``: where it listens, once it does (a SIGHUP before is no reload to report)."""

    app: web.Application
    home: Home
    env: Mapping[str, str]
    reopen_log: Callable[[], None]
    role: WorkerRole | None
    stop: asyncio.Event
    timeout_s: float
    url: str = ""
    _hangups: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_stop, signum)
        loop.add_signal_handler(signal.SIGHUP, self._on_hangup, loop)

    def _on_stop(self, signum: int) -> None:
        if self.stop.is_set():
            log.info("%s again: already shutting down", signal.Signals(signum).name)
            return
        log.info("%s: shutting down", signal.Signals(signum).name)
        self.stop.set()
        if self.role is None:
            systemd.stopping(self.env)
        _watchdog(self.home, self.timeout_s - WATCHDOG_MARGIN_S, worker=self.role is not None)

    def _on_hangup(self, loop: asyncio.AbstractEventLoop) -> None:
        task = loop.create_task(self._hangup())
        self._hangups.add(task)
        task.add_done_callback(self._hangups.discard)

    async def _hangup(self) -> None:
        notifying = self.role is None and bool(self.url)  # READY=1 only once it listens
        if notifying:
            systemd.reloading(self.env)
        try:
            await asyncio.to_thread(self.reopen_log)
            log.info("SIGHUP: log file reopened; reloading the configuration")
            await reload.on_hangup(self.app)
        finally:
            if notifying and not self.stop.is_set():
                systemd.ready(self.env, self.url)


async def _stop_taking_posts(app: web.Application) -> None:
    """At shutdown: what the other workers hand over from now on they store themselves; the posts
    handed over already are answered first."""
    await app[K.HANDOFF].server.close()


async def _run_handed(app: web.Application, post: Post, on_delta: DeltaFn | None) -> Mapping[str, Any]:
    """A post another worker handed over (``gateway.handoff``): run as if it came here."""
    return (await dispatch(app[K.COMMANDS], post, on_delta=on_delta)).body()


def _runner(app: web.Application, config: LoadedConfig) -> JsonErrorsAppRunner:
    """The app's runner, its connection cap set from the descriptors this process may open."""
    gateway = config.settings.gateway
    timeout = gateway.shutdown_timeout_s
    limits = connection_limits(gateway.max_connections, gateway.fd_reserve)
    app[GUARD].max_connections = limits.max_connections
    if limits.reason is not None:
        log.warning(limits.reason)
    grace = max(timeout / 2, timeout - CLEANUP_RESERVE_S)
    keepalive = gateway.keepalive_timeout_s
    return JsonErrorsAppRunner(app, access_log=None, shutdown_timeout=grace, keepalive_timeout=keepalive)


async def _announce(
    config: LoadedConfig, home: Home, host: str, port: int, env: Mapping[str, str], role: WorkerRole | None
) -> None:
    """Say where the gateway listens: a worker tells its supervisor (which writes gateway.json
    and prints it); a single process writes gateway.json, prints it and tells systemd."""
    url = url_for(host, port)
    if role is not None:
        log.info("worker %d listening on %s (pid %d)", role.index, url, os.getpid())
        role.ready()
        return
    info = {
        "pid": os.getpid(),
        "url": url,
        "started_at": iso(system_clock()),
        "home": str(home.root),
        "config_path": str(config.config_path.absolute()) if config.config_path else None,
        "version": version(),
    }
    await asyncio.to_thread(write_json_atomic, home.gateway_json, info)
    shown = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    print(f"neotask gateway listening on {shown} (home {home.root}, {describe_models(config)})", flush=True)
    log.info("listening on %s (pid %d)", url, os.getpid())
    systemd.ready(env, url)  # a Type=notify unit is started now (gateway/systemd.py)


async def _cleanup(runner: JsonErrorsAppRunner, home: Home) -> int:
    """Stop accepting, wait for in-flight requests, close the store: 0, or ``EXIT_STATE`` with
    one line when the home could not be written (e.g. ``contexts/`` turned read-only): what was
    acknowledged is durable already, and the next start recovers the rest."""
    try:
        await runner.cleanup()
    except DamagedState as exc:
        log.error("shutdown: %s", exc.message)
        return EXIT_STATE
    except OSError as exc:
        damage = storage_damage(exc.filename or home.contexts, exc, doing="save the sessions at shutdown")
        log.error("shutdown: %s (acknowledged messages are on disk; the next start recovers)", damage.message)
        return EXIT_STATE
    return 0


def _watchdog(home: Home, after_s: float, *, worker: bool = False) -> None:
    """The exit deadline holds even when a cleanup hangs (e.g. a model load that cannot be
    interrupted): acknowledged messages are durable already, and the next start recovers."""

    def force_exit() -> None:
        reason = f"shutdown did not finish within {after_s:.1f} s"
        sys.stderr.write(f"error: {reason}: exiting now\n")
        sys.stderr.flush()
        if not worker:  # a worker's supervisor owns gateway.json and the exit record
            _remove(home.gateway_json)
            record_exit(home, EXIT_FAILED, reason)
        os._exit(EXIT_FAILED)

    timer = threading.Timer(max(after_s, 0.1), force_exit)
    timer.daemon = True
    timer.start()


async def _tick_for_fleet(app: web.Application, stop: asyncio.Event) -> None:
    """Every ``STORED_EVERY_S`` until it stops, a worker counts what it batched and writes its
    status (``gateway/fleet.py``)."""
    reloads = app[reload.RELOADS]
    fleet = reloads.fleet
    while not stop.is_set():
        app[K.METRICS].flush()
        if fleet is not None:
            services = app.get(K.SERVICES)
            leader = services.leader if services is not None else None
            status = {"ready": all(app[K.READY].values()), "leader": bool(leader and leader.leading),
                      "since": iso(reloads.since), "reloads": reloads.count}  # fmt: skip
            await asyncio.to_thread(fleet.write_status, status)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), STORED_EVERY_S)


def _bound_port(addresses: list[Any], requested: int) -> int:
    for address in addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return requested


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


@contextlib.contextmanager
def _logging_to(home: Home, settings: LoggingSettings) -> Iterator[Callable[[], None]]:
    """Log to stderr and ``<home>/logs/gateway.log`` (rotated by size, repeats counted, not
    written: ``gateway.logs``) through a queue, so the event loop never waits on a log write.
    Yields what reopens the log file (SIGHUP, after an outside rotation moved it)."""
    home.logs.mkdir(parents=True, exist_ok=True)
    formatter = JsonFormatter() if settings.format == "json" else logging.Formatter(LOG_FORMAT)
    stderr = logging.StreamHandler(sys.stderr)
    file = file_handler(home.logs / "gateway.log", settings)
    for handler in (stderr, file):
        handler.setFormatter(formatter)
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = LogListener(records, stderr, file)
    root = logging.getLogger()
    queue_handler = logging.handlers.QueueHandler(records)
    queue_handler.addFilter(RedactFilter(SECRETS))  # tokens never reach a log line
    queue_handler.addFilter(RepeatFilter(settings.repeat_window_s))
    queue_handler.addFilter(ContextFilter())  # the ids of the request or turn, taken where it logs
    previous_level = root.level
    root.addHandler(queue_handler)
    root.setLevel(logging.INFO)
    for noisy in QUIET_LOGGERS:  # one INFO line per job run, per HTTP request to a model or hub
        logging.getLogger(noisy).setLevel(logging.WARNING)
    listener.start()
    try:
        yield listener.reopen_in_order
    finally:
        root.removeHandler(queue_handler)
        root.setLevel(previous_level)
        listener.stop()
        file.close()
