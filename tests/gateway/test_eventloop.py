"""gateway.event_loop: auto takes uvloop when installed; the stdlib loop keeps working."""

from __future__ import annotations

import asyncio

import pytest

from config.errors import ConfigError
from gateway import eventloop


async def _loop_type() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_asyncio_runs_on_the_stdlib_loop() -> None:
    assert eventloop.resolve("asyncio") == "asyncio"
    assert eventloop.run(_loop_type(), "asyncio").startswith("asyncio")


@pytest.mark.skipif(not eventloop.uvloop_available(), reason="uvloop is not installed")
def test_auto_and_uvloop_run_on_uvloop_when_installed() -> None:
    assert eventloop.resolve("auto") == "uvloop"
    assert eventloop.run(_loop_type(), "auto").startswith("uvloop")
    assert eventloop.run(_loop_type(), "uvloop").startswith("uvloop")


def test_uvloop_named_but_missing_fails_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eventloop, "uvloop_available", lambda: False)
    assert eventloop.resolve("auto") == "asyncio"
    with pytest.raises(ConfigError, match=r"gateway\.event_loop"):
        eventloop.resolve("uvloop")
