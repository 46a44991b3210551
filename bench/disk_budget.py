"""What the disk budget costs a message: ``os.statvfs`` of the home per call,
against the budget's cached check (free space read at most every ``storage.free_check_ms``), against
a bare function call as the baseline, in the same run.

    python -m bench.disk_budget [--quick] [--path DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from config.settings import StorageSettings
from conversations.metrics import Metrics
from gateway.disk_budget import DiskBudget


def per_call_ns(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / n)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--path", type=Path, default=None)
    args = parser.parse_args(argv)
    n = 2_000 if args.quick else 200_000
    with tempfile.TemporaryDirectory() as tmp:
        path = args.path or Path(tmp)
        budget = DiskBudget(path, StorageSettings(min_free=0), Metrics())  # default free_check_ms: 250

        def noop() -> None:
            return None

        base = per_call_ns(noop, n)
        statvfs = per_call_ns(lambda: os.statvfs(path), n)
        cached = per_call_ns(budget.check, n)
        fresh = per_call_ns(lambda: budget.check(fresh=True), n)
    print(f"calls per figure: {n} (best of 5), path {path}")
    print(f"baseline (empty call)      {base:8.0f} ns  1.0x")
    print(f"os.statvfs                 {statvfs:8.0f} ns  {statvfs / base:.1f}x")
    print(f"budget.check (cached)      {cached:8.0f} ns  {cached / base:.1f}x")
    print(f"budget.check (statvfs)     {fresh:8.0f} ns  {fresh / base:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
