"""Prometheus metrics, one registry per app (no process globals).

The workers of ``neotask gateway --workers N`` count in prometheus_client's multiprocess mode:
the supervisor gives them one folder (``PROMETHEUS_MULTIPROC_DIR``) where each process keeps its
values, and ``render`` on any worker reads them all: counters and histograms summed over the
workers, those of a worker that died and was started again included, the gauges as the highest of
the live workers. Without the variable (one process) the app's own registry is rendered."""

from __future__ import annotations

import os
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STORED_BATCH = 256
STORED_EVERY_S = 1.0  # a batch is counted at least this often (another worker's scrape reads it)
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.messages = Counter("neotask_messages_total", "Messages stored", ["role"], registry=self.registry)
        self.turns = Counter("neotask_turns_total", "Model turns", ["outcome"], registry=self.registry)
        self.compactions = Counter(
            "neotask_compactions_total", "Context compactions", ["trigger"], registry=self.registry
        )
        self.resets = Counter("neotask_resets_total", "Session resets", ["reason"], registry=self.registry)
        self.tokens = Counter("neotask_tokens_total", "Provider token usage", ["kind"], registry=self.registry)
        self.turn_seconds = Histogram(
            "neotask_turn_seconds",
            "Model turn latency",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        self.append_seconds = Histogram(
            "neotask_append_seconds",
            "Time to make a posted message durable",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
            registry=self.registry,
        )
        self.active_sessions = Gauge(
            "neotask_active_runs", "Runs running or paused", registry=self.registry, multiprocess_mode="livemax"
        )
        self.disk_low = Gauge(
            "neotask_disk_low", "1 while free disk space is below storage.min_free", registry=self.registry,
            multiprocess_mode="livemax",
        )  # fmt: skip
        self.disk_low_crossings = Counter(
            "neotask_disk_low_crossings", "Times free disk space fell below storage.min_free", registry=self.registry
        )
        self.handoffs = Counter(
            "neotask_handoffs_total",
            "Posts for a key another worker owns (--workers N, gateway.key_handoff), by what became of them",
            ["result"], registry=self.registry,
        )  # fmt: skip
        self.handoffs_served = Counter(
            "neotask_handoffs_served_total", "Posts stored for another worker that took them", registry=self.registry
        )
        self.history_waits = Counter(
            "neotask_history_waits_total",
            "Posts that waited for the history index to catch up (history.max_backlog)",
            registry=self.registry,
        )
        self._handoffs: dict[str, int] = {}  # by result, not yet counted
        self._stored_by_role: dict[str, Any] = {}
        self._stored: list[tuple[str, float]] = []  # (role, seconds) not yet counted
        self._counted_at = time.monotonic()

    def message_stored(self, role: str, seconds: float) -> None:
        """A posted message made durable in ``seconds``. Counted in batches (a counter and a
        histogram take a lock and search the buckets per call): before every scrape, and every
        ``STORED_BATCH`` messages."""
        stored = self._stored
        stored.append((role, seconds))
        if len(stored) >= STORED_BATCH or time.monotonic() - self._counted_at >= STORED_EVERY_S:
            self._count_stored()

    def handoff(self, result: str) -> None:
        """What became of a post for a key another worker owns (``gateway.handoff``'s results;
        ``served``: one run here for another worker). Counted with the stored messages' batch."""
        self._handoffs[result] = self._handoffs.get(result, 0) + 1

    def flush(self) -> None:
        """Count what is batched (a worker's timer: other workers' scrapes read the counts)."""
        if self._stored or self._handoffs:
            self._count_stored()

    def _count_stored(self) -> None:
        stored, self._stored = self._stored, []
        self._counted_at = time.monotonic()
        by_role: dict[str, int] = {}
        for role, seconds in stored:
            by_role[role] = by_role.get(role, 0) + 1
            self.append_seconds.observe(seconds)
        for role, count in by_role.items():
            child = self._stored_by_role.get(role)
            if child is None:
                child = self._stored_by_role[role] = self.messages.labels(role)
            child.inc(count)
        handoffs, self._handoffs = self._handoffs, {}
        for result, count in handoffs.items():
            (self.handoffs_served if result == "served" else self.handoffs.labels(result)).inc(count)

    def render(self) -> bytes:
        self._count_stored()
        if not os.environ.get(MULTIPROCESS_ENV):
            return generate_latest(self.registry)
        from prometheus_client.multiprocess import MultiProcessCollector

        fleet = CollectorRegistry()
        MultiProcessCollector(fleet)  # type: ignore[no-untyped-call]  # every worker's values, summed
        return generate_latest(fleet)


def multiprocess() -> bool:
    """Whether this process counts in the fleet's folder (a worker of ``--workers N``)."""
    return bool(os.environ.get(MULTIPROCESS_ENV))
