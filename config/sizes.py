"""Sizes written by people: ``1GiB``, ``500MB``, ``1048576`` (bytes) or ``5%`` (of a file system)."""

from __future__ import annotations

import re
from dataclasses import dataclass

UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
         "t": 1000**4, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
HOW = "write bytes (1073741824), a size (1GiB, 500MB) or a percent of the disk (5%)"


@dataclass(frozen=True)
class Threshold:
    """Free space to keep: bytes, or a percent of the file system's size."""

    bytes: int | None = None
    percent: float | None = None

    def of(self, total: int) -> int:
        return self.bytes if self.bytes is not None else int(total * (self.percent or 0) / 100)


def parse_threshold(value: str | int) -> Threshold:
    """``ValueError`` naming what to write when ``value`` is neither a size nor a percent."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}; {HOW}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative ({value}); {HOW}")
        return Threshold(bytes=value)
    percent = _PERCENT.match(value)
    if percent:
        share = float(percent.group(1))
        if share > 100:
            raise ValueError(f"{value!r} is more than the whole disk; {HOW}")
        return Threshold(percent=share)
    size = _SIZE.match(value)
    if size and size.group(2).lower() in UNITS:
        return Threshold(bytes=int(float(size.group(1)) * UNITS[size.group(2).lower()]))
    raise ValueError(f"not a size: {value!r}; {HOW}")
