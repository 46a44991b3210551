"""``memory/native_libraries.py``: torch's large library is opened before torch is imported, with
the interpreter lock released, and the import that follows uses it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from memory import native_libraries

pytestmark = pytest.mark.realtime  # a child interpreter

CHILD = """
import sys, threading, time
from memory import native_libraries
opened = native_libraries.preload("torch")
maps = open("/proc/self/maps").read()
print("opened", [p.name for p in opened])
print("mapped", "libtorch_cpu.so" in maps)
print("imported", "torch" in sys.modules)
import torch
print("same", sum(line.endswith("libtorch_cpu.so") for line in open("/proc/self/maps").read().splitlines()) > 0,
      float(torch.ones(2).sum()))
"""


def test_torch_library_is_opened_without_importing_torch() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=120)
    lines = out.stdout.splitlines()
    assert lines[:3] == ["opened ['libtorch_cpu.so']", "mapped True", "imported False"], out.stdout
    assert lines[3] == "same True 2.0"  # torch imports on top of the preloaded library and works


def test_a_package_that_is_missing_or_has_nothing_heavy_is_left_alone() -> None:
    assert native_libraries.preload("no_such_package_here") == []
    assert native_libraries.preload("json") == []  # installed, nothing listed
    assert native_libraries.package_dir("json") is not None
