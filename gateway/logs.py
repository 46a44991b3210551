"""Bounded logs: ``logs/gateway.log`` rotated by size
(``logging.handlers.RotatingFileHandler``), and a filter that writes a line repeated within
``logging.repeat_window_s`` once, then counts the repeats (``accept() out of system resource`` in a
loop once grew the log by 256 MB in 3 minutes)."""

from __future__ import annotations

import logging
import logging.handlers
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from config.settings import LoggingSettings
from conversations.log_context import EACH

MAX_KEYS = 1024  # distinct lines (and templates) tracked at once; older ones are forgotten first
TEMPLATE_LINES = 20  # distinct lines of one template written per window; more are counted
REOPEN = "neotask_reopen"  # the attribute of the queue's marker record that asks for a reopen
REOPEN_WAIT_S = 5.0


class RepeatFilter(logging.Filter):
    """Lets the first of identical records through; drops the repeats within ``window_s`` and
    notes their number on the next one that passes. Records are the same when their logger, level,
    message *as written* (template and arguments) and exception type are: a second account's
    "connected" line or a second pairing code is another event and is written. A flood of distinct
    lines of one template (a counter in a loop) is bounded too: past ``TEMPLATE_LINES`` of them in
    a window, the rest are dropped and counted on the next line of that template that passes."""

    def __init__(self, window_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[tuple[object, ...], tuple[float, int]] = {}  # line -> (first seen, dropped since)
        self._templates: dict[tuple[object, ...], tuple[float, int, int]] = {}  # -> (window start, lines, dropped)
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.window_s <= 0 or getattr(record, EACH, False):
            return True
        exc_type = record.exc_info[0] if record.exc_info else None
        template = (record.name, record.levelno, str(record.msg), exc_type)
        written = _written(record)
        line = (*template, written)
        now = self.clock()
        with self._lock:
            first, dropped = self._seen.get(line, (None, 0))
            if first is not None and now - first < self.window_s:
                self._seen[line] = (first, dropped + 1)
                return False
            started, lines, flooded = self._templates.get(template, (now, 0, 0))
            if now - started >= self.window_s:
                started, lines = now, 0
            if lines >= TEMPLATE_LINES:
                self._templates[template] = (started, lines, flooded + 1)
                return False
            self._templates.pop(template, None)
            self._templates[template] = (started, lines + 1, 0)
            self._seen.pop(line, None)
            self._seen[line] = (now, 0)
            for table in (self._seen, self._templates):
                if len(table) > MAX_KEYS:
                    del table[next(iter(table))]
        notes = []
        if dropped:
            notes.append(f"{dropped} more like this")
        if flooded:
            notes.append(f"{flooded} other lines of this kind")
        if notes:
            note = f" [{' and '.join(notes)} in the last {self.window_s:g} s not logged]"
            record.msg, record.args = written + note, None  # written already: no arguments left to apply
        return True


class RedactFilter(logging.Filter):
    """Hides every registered secret (``config/redaction.py``) in a record's message and traceback
    before any handler writes it: a library's error may quote a URL that holds the token."""

    def __init__(self, redact: Callable[[str], str]) -> None:
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        written = _written(record)
        clean = self.redact(written)
        if clean != written:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)  # the formatters reuse it
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        return True


def _written(record: logging.LogRecord) -> str:
    """The record's message with its arguments applied, as a handler will write it."""
    try:
        return record.getMessage()
    except Exception:  # arguments that do not fit: logging reports it when it formats
        return str(record.msg)


def file_handler(path: Path, settings: LoggingSettings) -> logging.FileHandler:
    """``gateway.log``, rotated at ``max_bytes`` keeping ``backup_count`` files (0: never rotated)."""
    if settings.max_bytes > 0:
        return logging.handlers.RotatingFileHandler(
            path, maxBytes=settings.max_bytes, backupCount=settings.backup_count, encoding="utf-8"
        )
    return logging.FileHandler(path, encoding="utf-8")


class LogListener(logging.handlers.QueueListener):
    """The queue's writer thread, which also reopens the log file *in the queue's order*: a
    record logged before SIGHUP lands in the file that was rotated away, one logged after it in
    the new file, however far behind the writer is (the event loop never waits on a write, so the
    queue may hold records that were logged before the signal came)."""

    def __init__(self, records: queue.SimpleQueue[logging.LogRecord], stderr: logging.Handler,
                 file: logging.FileHandler) -> None:
        super().__init__(records, stderr, file, respect_handler_level=True)
        self.records = records
        self.file = file

    def handle(self, record: logging.LogRecord) -> None:
        done = getattr(record, REOPEN, None)
        if isinstance(done, threading.Event):
            try:
                reopen(self.file)
            finally:
                done.set()
            return
        super().handle(record)

    def reopen_in_order(self, timeout_s: float = REOPEN_WAIT_S) -> None:
        """Queue a reopen behind every record logged so far and wait until the writer did it
        (blocking: call it from a thread). A writer that does not get there in ``timeout_s``
        (stopped, or stuck on a full disk) leaves the reopen to be done here."""
        done = threading.Event()
        marker = logging.makeLogRecord({REOPEN: done, "msg": "reopen the log file"})
        self.records.put(marker)
        if not done.wait(timeout_s):
            reopen(self.file)


def reopen(handler: logging.FileHandler) -> None:
    """Close the handler's file and open its path again (a log rotator moved the file away and
    sent SIGHUP): later records go to a new file at the same path."""
    handler.acquire()
    try:
        if handler.stream is not None:
            handler.stream.close()
        handler.stream = handler._open()
    finally:
        handler.release()
