"""Notice changed memory files: a debounced watchfiles watcher plus a periodic polling sweep.

The watcher gives low latency; the sweep (every ``watch.poll_seconds``) is the fallback for file
systems without change events, workspaces created after start, and missed events. Both only say
*which agents* to look at; the indexer's stat scan finds the files.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from config.settings import WatchSettings

log = logging.getLogger("neotask.memory")


def _owner(path: Path, roots: Mapping[str, Path]) -> str | None:
    for agent, root in roots.items():
        if path.is_relative_to(root):
            return agent
    return None


def _md_filter(_change: object, path: str) -> bool:
    return path.endswith((".md", ".MD")) or "." not in Path(path).name


async def watch(
    workspaces: Mapping[str, Path],
    extra_roots: Mapping[str, Iterable[Path]],
    settings: WatchSettings,
    notify: Callable[[set[str]], None],
    stop: asyncio.Event,
) -> None:
    """Call ``notify(agents)`` for changes under the workspaces until ``stop`` is set."""
    import watchfiles

    roots: dict[str, Path] = {}
    for agent, ws in workspaces.items():
        if ws.is_dir():
            roots[agent] = ws.resolve()
    watched = list(roots.values())
    for agent, extras in extra_roots.items():
        for extra in extras:
            if extra.exists() and not any(extra.resolve().is_relative_to(r) for r in watched):
                watched.append(extra.resolve())
                roots.setdefault(f"{agent}\0{extra}", extra.resolve())
    if not watched:
        return
    try:
        async for changes in watchfiles.awatch(
            *watched,
            watch_filter=_md_filter,
            debounce=settings.debounce_ms,  # at most this long gathering a burst of changes
            step=min(settings.debounce_ms, 300),  # ...which ends after this long without a change
            stop_event=stop,
            recursive=True,
        ):
            agents = {a.split("\0")[0] for _, p in changes if (a := _owner(Path(p), roots)) is not None}
            if agents:
                notify(agents)
    except (OSError, RuntimeError) as exc:  # e.g. inotify limits: the polling sweep still runs
        log.warning("memory file watcher stopped, relying on polling: %s", exc)


async def sweep(agents: Iterable[str], every_s: float, notify: Callable[[set[str]], None], stop: asyncio.Event) -> None:
    """Call ``notify(all agents)`` every ``every_s`` seconds until ``stop`` is set."""
    names = set(agents)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=every_s)
        except TimeoutError:
            notify(set(names))
