"""The append writer: one thread owns every run file handle and does all appends, rewrites and
folder moves in arrival order, with group commit.

Appends arrive from the event loop already in seq order (the seq is assigned on the loop just
before the append is queued), so the file order is the seq order. Under ``fsync: batch`` the thread
takes every queued operation, writes them, then syncs each touched file once and resolves all
their futures together: one sync covers every append that arrived meanwhile.

Hand-offs are per batch, not per message, both ways: the loop collects the operations queued
during one pass of its callbacks and passes them over in one queue item (one wake-up of the
thread, one contest for the GIL), and the thread resolves a batch's futures in one callback.
Per append the thread makes one ``write`` (each system call hands the GIL back and must win it
again from the busy loop): the size a failed append cuts back to is kept per open file, not read
by an ``fstat`` each time (``_size`` says when it is dropped), and syncs are ``fdatasync``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
import queue
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from home.atomic import fsync_dir

log = logging.getLogger(__name__)

T = TypeVar("T")
FsyncPolicy = Literal["batch", "always", "never"]


@dataclass
class _Append:
    path: Path
    data: bytes
    durable: bool
    future: asyncio.Future[Any] | None
    error: BaseException | None = None
    also: tuple[Path, bytes] | None = None  # a derived line written with it: both or neither
    guarded: bool = False  # after a failure, later appends to ``path`` fail until ``reopen``
    start: int = -1  # the size of ``path`` before this append (what a failure cuts back to)
    also_start: int = -1
    on_done: Callable[[BaseException | None], None] | None = None  # on the loop, before ``future``


@dataclass
class _Reopen:
    path: Path


@dataclass
class _Call:
    fn: Callable[[], Any]
    future: asyncio.Future[Any] | None
    result: Any = None
    error: BaseException | None = None


@dataclass
class WriterStats:
    appends: int = 0
    syncs: int = 0
    batches: int = 0
    calls: int = 0


_STOP = object()
SYNC_THREADS = 32


class AppendWriter:
    def __init__(self, fsync: FsyncPolicy = "batch", *, max_open: int = 256) -> None:
        self.fsync = fsync
        self.max_open = max_open
        self.stats = WriterStats()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._handles: OrderedDict[Path, int] = OrderedDict()
        self._sizes: dict[int, int] = {}  # open descriptor -> its file's size, see ``_size``
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sync_pool: ThreadPoolExecutor | None = None
        self._barred: dict[Path, OSError] = {}  # guarded files whose last append failed
        self._stuck: set[Path] = set()  # files a failed append could not be cut back on
        self.last_error: OSError | None = None  # the last failed append, until one succeeds
        self._outbox: list[_Append | _Call | _Reopen] = []  # queued on the loop, handed over once per loop pass

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.fsync == "batch":
            self._sync_pool = ThreadPoolExecutor(max_workers=SYNC_THREADS, thread_name_prefix="neotask-fsync")
        self._thread = threading.Thread(target=self._run, name="neotask-writer", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Finish every queued operation, close the handles, stop the thread."""
        if self._thread is None:
            return
        self._hand_over()
        self._queue.put(_STOP)
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        if self._sync_pool is not None:
            self._sync_pool.shutdown(wait=True)
            self._sync_pool = None

    # -- called on the event loop ---------------------------------------------------------------

    def append(
        self,
        path: Path,
        data: bytes,
        *,
        durable: bool,
        also: tuple[Path, bytes] | None = None,
        guarded: bool = False,
        on_done: Callable[[BaseException | None], None] | None = None,
    ) -> asyncio.Future[None]:
        """Queue an append; the future resolves once it is written (and synced, if durable under
        ``batch`` or ``always``). ``on_done`` is called on the loop with the append's error (None:
        it is durable) just before the future is resolved, and also when the future was
        cancelled meanwhile: what must follow the append's outcome goes there, and an awaiting
        caller that is cancelled needs no ``asyncio.shield``.

        A failed append (a full disk, a read-only file system) leaves no part of itself behind:
        the file, and the ``also`` file written with it, are cut back to their length before it,
        so the next append never lands glued onto a partial line. With ``guarded`` (files whose
        lines carry consecutive numbers), every later append to ``path`` fails with the same
        error until ``reopen(path)`` is queued: nothing is written after a gap."""
        future = self._new_future()
        self._enqueue(_Append(path, data, durable, future, also=also, guarded=guarded, on_done=on_done))
        return future

    def reopen(self, path: Path) -> None:
        """Let appends to a guarded ``path`` be tried again (queued: it applies to what follows)."""
        self._enqueue(_Reopen(path))

    def append_nowait(self, path: Path, data: bytes) -> None:
        """Queue a derived, non-durable append nobody waits for."""
        self._enqueue(_Append(path, data, False, None))

    def call(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run ``fn`` on the writer thread after everything queued before it is written and synced."""
        future = self._new_future()
        self._enqueue(_Call(fn, future))
        return future

    def _enqueue(self, op: _Append | _Call | _Reopen) -> None:
        """Queue ``op`` behind everything queued before it; the first operation of a loop pass
        schedules the hand-over of all of them."""
        if self._loop is None or self._thread is None:
            raise RuntimeError("the append writer is not running")
        if not self._outbox:
            self._loop.call_soon(self._hand_over)
        self._outbox.append(op)

    def _hand_over(self) -> None:
        if self._outbox:
            ops, self._outbox = self._outbox, []
            self._queue.put(ops)

    def _new_future(self) -> asyncio.Future[Any]:
        if self._loop is None or self._thread is None:
            raise RuntimeError("the append writer is not running")
        return self._loop.create_future()

    # -- called on the writer thread only -------------------------------------------------------

    def close_handles_under(self, folder: Path) -> None:
        """Drop cached handles of files inside ``folder`` (before it is moved or removed)."""
        for path in [p for p in self._handles if p.is_relative_to(folder)]:
            self._close(self._handles.pop(path))

    def close_handle(self, path: Path) -> None:
        fd = self._handles.pop(path, None)
        if fd is not None:
            self._close(fd)

    def _close(self, fd: int) -> None:
        self._sizes.pop(fd, None)  # the number may be reused by the next open
        os.close(fd)

    def _size(self, fd: int) -> int:
        """The size of ``fd``'s file: what a failed append cuts back to. Kept per descriptor
        instead of an ``fstat`` per append: read once by ``fstat``, then advanced by each append
        written whole. It is exact because only this thread changes run files while the store is
        open (appends, cuts, and ``call`` functions); it is dropped, so the next append reads it
        again, whenever it could be wrong: after any failed write or cut, after every ``call``
        (which may rewrite, truncate or replace files by other means), on ``reopen``, and when
        the descriptor is closed (its number may be reused)."""
        size = self._sizes.get(fd)
        if size is None:
            size = self._sizes[fd] = os.fstat(fd).st_size
        return size

    def _fd(self, path: Path) -> int:
        fd = self._handles.get(path)
        if fd is not None:
            self._handles.move_to_end(path)
            return fd
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except FileNotFoundError:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            if self.fsync != "never":
                fsync_dir(path.parent)
        self._handles[path] = fd
        return fd

    def _trim_handles(self) -> None:
        """Close the least recently used handles beyond ``max_open``; only between batches, once
        every touched file is synced (a handle closed mid-batch would leave its sync to a closed,
        or worse a reused, descriptor)."""
        while len(self._handles) > self.max_open:
            _, old = self._handles.popitem(last=False)
            self._close(old)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            items = [self._queue.get()]
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            batch = [op for item in items for op in (item if isinstance(item, list) else (item,))]
            dirty: dict[int, list[_Append]] = {}
            done: list[_Append | _Call] = []
            for op in batch:
                if op is _STOP:
                    stopping = True
                elif isinstance(op, _Append):
                    self._write(op, dirty)
                    done.append(op)
                elif isinstance(op, _Reopen):
                    self._sizes.clear()
                    if op.path not in self._stuck:
                        self._barred.pop(op.path, None)
                else:
                    self._sync(dirty)
                    try:
                        self._invoke(op)
                    finally:
                        self._sizes.clear()
                    done.append(op)
            self._sync(dirty)
            self._trim_handles()
            self.stats.batches += 1
            self._resolve(done)
        for fd in self._handles.values():
            os.close(fd)
        self._handles.clear()
        self._sizes.clear()

    def _write(self, op: _Append, dirty: dict[int, list[_Append]]) -> None:
        barred = self._barred.get(op.path) or (self._barred.get(op.also[0]) if op.also else None)
        if barred is not None:
            op.error = barred
            return
        try:
            fd = self._fd(op.path)
            op.start = self._size(fd)
            self._sizes.pop(fd)  # unknown until the write is whole
            _write_all(fd, op.data)
            self._sizes[fd] = op.start + len(op.data)
            if op.also is not None:
                also_fd = self._fd(op.also[0])
                op.also_start = self._size(also_fd)
                self._sizes.pop(also_fd)
                _write_all(also_fd, op.also[1])
                self._sizes[also_fd] = op.also_start + len(op.also[1])
            self.stats.appends += 1
            if op.durable and self.fsync == "always":
                _datasync(fd)
                self.stats.syncs += 1
            elif op.durable and self.fsync == "batch":
                dirty.setdefault(fd, []).append(op)
        except OSError as exc:
            self._fail([op], exc)
            return
        if op.durable and self.fsync != "batch":
            self.last_error = None

    def _fail(self, ops: list[_Append], exc: OSError) -> None:
        """Cut the files of failed appends back to their length before the first of them."""
        first = ops[0]
        log.error("append to %s failed (%d append(s) undone): %s", first.path, len(ops), exc)
        self.last_error = exc
        for op in ops:
            op.error = exc
        cuts = [(first.path, first.start)]
        starts = [op.also_start for op in ops if op.also is not None and op.also_start >= 0]
        if first.also is not None and starts:
            cuts.append((first.also[0], min(starts)))
        for path, size in cuts:
            if size >= 0:
                self._cut(path, size)
        if first.guarded:
            self._barred[first.path] = exc

    def _cut(self, path: Path, size: int) -> None:
        try:
            fd = self._fd(path)
            self._sizes.pop(fd, None)  # read again by the next append, whatever happens here
            if os.fstat(fd).st_size > size:
                os.ftruncate(fd, size)
        except OSError as exc:
            # A partial line stays: refuse every later append to this file until a restart,
            # whose recovery cuts the torn tail.
            log.critical("could not cut %s back to %d bytes after a failed append: %s", path, size, exc)
            self._stuck.add(path)
            self._barred[path] = exc

    def _sync(self, dirty: dict[int, list[_Append]]) -> None:
        """Make every touched file durable. One file: fdatasync. Several: one ``syncfs`` of their
        filesystem where the platform has it (a batch of 64 files costs about one flush instead
        of 64 in a row), else fdatasyncs run in parallel. Either way the batch waits for all of it."""
        if not dirty:
            return
        items = list(dirty.items())
        errors: list[OSError | None]
        if len(items) > 1 and _SYNCFS is not None and _syncfs(items[0][0]) is None:
            errors = [None] * len(items)
        elif len(items) == 1 or self._sync_pool is None:
            errors = [_fsync(fd) for fd, _ in items]
        else:
            errors = list(self._sync_pool.map(_fsync, [fd for fd, _ in items]))
        for (_, ops), error in zip(items, errors, strict=True):
            if error is not None:
                self._fail(ops, error)
        if not any(errors):
            self.last_error = None
        self.stats.syncs += len(items)
        dirty.clear()

    def _invoke(self, op: _Call) -> None:
        self.stats.calls += 1
        try:
            op.result = op.fn()
        except Exception as exc:  # handed to the awaiting coroutine, which decides
            op.error = exc

    def _resolve(self, done: list[_Append | _Call]) -> None:
        waiting = [op for op in done if op.future is not None]
        if waiting and self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed under us during shutdown
                self._loop.call_soon_threadsafe(_settle, waiting)


def _load_syncfs() -> Any:
    """libc's ``syncfs(2)`` (Linux), called through ctypes, which releases the GIL meanwhile."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_SYNCFS = _load_syncfs()


def _syncfs(fd: int) -> OSError | None:
    if _SYNCFS(fd) == 0:
        return None
    errno = ctypes.get_errno()
    return OSError(errno, os.strerror(errno))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written == 0:  # never loop on a file that takes nothing
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


# An append's durability needs its data and the file's new size on disk, not its times:
# ``fdatasync`` flushes exactly that (POSIX: metadata "needed to allow a subsequent data retrieval",
# which includes the size an append or a cut changes) and skips the mtime-only inode write that
# ``fsync`` adds. A new file's directory entry is synced separately (``fsync_dir``), as before.
_datasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


def _fsync(fd: int) -> OSError | None:
    try:
        _datasync(fd)
    except OSError as exc:
        return exc
    return None


def _settle(ops: list[_Append | _Call]) -> None:
    for op in ops:
        if isinstance(op, _Append) and op.on_done is not None:
            try:
                op.on_done(op.error)
            except Exception:  # one append's bookkeeping must not keep the batch's others waiting
                log.exception("an append's completion callback failed")
        future = op.future
        if future is None or future.done():
            continue
        if op.error is not None:
            future.set_exception(op.error)
        else:
            future.set_result(op.result if isinstance(op, _Call) else None)
