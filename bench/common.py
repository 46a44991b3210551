"""Timing helpers shared by the benchmarks: repeats, percentiles, a printed table, PASS/FAIL lines
and the ``--quick`` flag.

Machines are noisy, so a benchmark never compares against a fixed number of seconds: it measures
a baseline in the same run, interleaved with the thing measured, and reports the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

now = time.perf_counter


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """An argument parser every benchmark shares; ``--quick`` shrinks sizes for CI smoke runs
    (the figures of a quick run are not meaningful, only that the benchmark still works)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run for CI, not a measurement")
    return parser


def repeat(fn: Callable[[], object], times: int) -> list[float]:
    """Seconds taken by each of ``times`` sequential calls of ``fn``."""
    samples = []
    for _ in range(times):
        start = now()
        fn()
        samples.append(now() - start)
    return samples


async def repeat_async(fn: Callable[[], Awaitable[object]], times: int) -> list[float]:
    """Seconds taken by each of ``times`` sequential awaits of ``fn()``."""
    samples = []
    for _ in range(times):
        start = now()
        await fn()
        samples.append(now() - start)
    return samples


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * pct / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Summary:
    n: int
    p50: float
    p95: float
    p99: float
    mean: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        return cls(
            n=len(values),
            p50=percentile(values, 50),
            p95=percentile(values, 95),
            p99=percentile(values, 99),
            mean=statistics.fmean(values),
        )


def ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline > 0 else math.inf


def fmt_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} µs"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Columns padded to their widest cell; the first column left-aligned, the rest right."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))

    print("  " + line(cells[0]))
    print("  " + "  ".join("-" * w for w in widths))
    for row in cells[1:]:
        print("  " + line(row))


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


@dataclass
class Report:
    """Collects the targets of one benchmark module and prints a PASS/FAIL line for each."""

    name: str
    results: list[tuple[str, bool]] = field(default_factory=list)

    def check(self, label: str, value: float, limit: float, *, unit: str = "x", digits: int = 2) -> bool:
        """PASS when ``value <= limit``."""
        passed = value <= limit
        self.results.append((label, passed))
        verdict = "PASS" if passed else "FAIL"
        print(f"  {verdict}  {label}: {value:.{digits}f}{unit} (target ≤ {limit:.{digits}f}{unit})", flush=True)
        return passed

    def finish(self) -> int:
        """Print the tally; 0 when every target passed, else 1 (the exit status)."""
        failed = [label for label, passed in self.results if not passed]
        print(f"\n{self.name}: {len(self.results) - len(failed)}/{len(self.results)} targets passed", flush=True)
        for label in failed:
            print(f"  FAILED: {label}")
        return 1 if failed else 0


class ServerProcess:
    """A bench server in its own process (``python -m <module> --serve ...``) that prints
    ``PORT <n>`` once it listens and exits when its stdin closes; ``port`` once it listens."""

    def __init__(
        self, module: str, args: Sequence[str], *, what: str, stop_timeout_s: float, root: Path | None = None
    ) -> None:
        """``root``: the source tree to run the server from (default: this one)."""
        cmd = [sys.executable, "-m", module, "--serve", *args]
        root = root or Path(__file__).resolve().parents[1]
        self.stop_timeout_s = stop_timeout_s
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=root, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"the {what} server did not start (said {line!r})")
        self.port = int(line.split()[1])

    def stop(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
