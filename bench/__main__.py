"""Run every benchmark module in ``bench/`` in turn: ``python -m bench [--quick] [name ...]``.

A module is a benchmark when it defines ``main(argv: Sequence[str] | None) -> int | None``
(``None`` or 0: every target met). Modules are found, not listed, so new ones (``memory_*.py``)
join by existing; one that fails to import is skipped with the reason and the run carries on.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType

import bench

NOT_BENCHMARKS = frozenset({"__main__", "common"})


def module_names() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.iter_modules(bench.__path__)
        if not info.ispkg and info.name not in NOT_BENCHMARKS and not info.name.startswith("_")
    )


def load(name: str) -> Callable[..., object] | None:
    """The module's ``main``, or None when it has none; import errors propagate."""
    module: ModuleType = importlib.import_module(f"bench.{name}")
    entry = getattr(module, "main", None)
    return entry if callable(entry) else None


def call(entry: Callable[..., object], argv: list[str]) -> object:
    """``main(argv)``, or ``main()`` for a module whose main takes no arguments."""
    if inspect.signature(entry).parameters:
        return entry(argv)
    return entry()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run for CI, not a measurement")
    parser.add_argument("names", nargs="*", help="run only these modules (default: all)")
    args = parser.parse_args(argv)
    available = module_names()
    unknown = sorted(set(args.names) - set(available))
    if unknown:
        parser.error(f"no benchmark module {', '.join(unknown)}; available: {', '.join(available)}")
    forwarded = ["--quick"] if args.quick else []
    outcomes: list[tuple[str, str]] = []
    for name in args.names or available:
        try:
            entry = load(name)
        except Exception as exc:  # a broken or half-installed module must not stop the others
            print(f"\n### bench.{name}: SKIPPED, import failed: {type(exc).__name__}: {exc}", flush=True)
            outcomes.append((name, "skipped (import failed)"))
            continue
        if entry is None:
            continue
        print(f"\n### bench.{name}", flush=True)
        start = time.perf_counter()
        try:
            status = call(entry, forwarded)
        except Exception:  # report it and go on with the next module
            traceback.print_exc()
            outcomes.append((name, "ERROR"))
            continue
        elapsed = time.perf_counter() - start
        outcomes.append((name, f"{'ok' if not status else 'targets failed'} ({elapsed:.1f} s)"))
    print("\n### summary")
    for name, outcome in outcomes:
        print(f"  bench.{name}: {outcome}")
    # A skipped module (say, an optional dependency missing) is reported but does not fail the run.
    return 1 if any(o.startswith(("ERROR", "targets failed")) for _, o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
