"""Loading a package's large native libraries without holding the interpreter lock.

CPython loads an extension module's shared libraries (``dlopen``: reading hundreds of megabytes,
relocating them, running their C++ static initialisers) with the GIL held, so a model loaded on a
background thread still stops the event loop for that long: importing torch on its loader thread
stopped the main thread for 0.3-0.4 s on this machine with a warm page cache and 0.7-1.2 s with a
cold one (``bench/model_load_stall.py``), long enough for the suite's loop guard to fail a test.

:func:`preload` opens such libraries first through libc's ``dlopen`` called by ctypes, which
releases the GIL for the length of a foreign call. When Python's import later opens the same
library (by path or as a dependency), the dynamic loader finds it already loaded and only counts a
reference. Only libraries that do not call into Python while loading may be preloaded this way
(torch's ``libtorch_cpu.so`` is plain C++; ``libtorch_python.so`` is not).
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

# package -> the libraries inside it (relative paths) whose loading is long and Python-free
HEAVY = {"torch": ("lib/libtorch_cpu.so",)}


def package_dir(package: str) -> Path | None:
    """Where an installed top-level package lives, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def preload(package: str) -> list[Path]:
    """Open ``package``'s heavy native libraries with the GIL released; the ones opened. A missing
    package or library, or a loader that refuses one, is left to the import (which then loads it
    as it always did, or raises its own error)."""
    root = package_dir(package)
    if root is None:
        return []
    try:
        libc = ctypes.CDLL(None)
        dlopen = libc.dlopen
    except (OSError, AttributeError):  # no libc dlopen reachable: nothing gained, nothing lost
        return []
    dlopen.restype = ctypes.c_void_p
    dlopen.argtypes = [ctypes.c_char_p, ctypes.c_int]
    opened = []
    for relative in HEAVY.get(package, ()):
        path = root / relative
        if not path.is_file():
            continue
        # RTLD_LOCAL: the symbols stay where the package's own import would put them
        if dlopen(os.fsencode(path), os.RTLD_NOW | os.RTLD_LOCAL):
            opened.append(path)
        else:
            log.debug("could not preload %s; the import will load it", path)
    return opened
