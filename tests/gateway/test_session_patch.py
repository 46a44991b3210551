"""PATCH /v1/sessions/{key}: a sessions.json entry stays small (SPEC section 2: under 2 KB), so a
model override is bounded like the label; a refused PATCH writes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway import keys as K
from tests.gateway.conftest import Client, settled
from tests.gateway.helpers import tree_digest

MAIN = "/v1/sessions/agent%3Amain%3Amain"


@pytest.fixture
async def client(client: Client) -> Client:
    assert (await client.post(f"{MAIN}/messages", json={"content": "hello"})).status == 200
    await settled(client)
    return client


@pytest.mark.parametrize("model", ["m" * 201, "m" * 100_000, "gpt\x00x", "gpt\nx", "gpt\u2028x", "  ", 5])
async def test_an_overlong_model_override_is_refused_and_changes_nothing(
    client: Any, tmp_path: Path, model: str
) -> None:
    before = tree_digest(tmp_path)
    resp = await client.patch(MAIN, json={"settings": {"model": model}})
    assert resp.status == 400, await resp.text()
    error = (await resp.json())["error"]
    assert error["code"] == "invalid_field" and error["field"] == "settings.model"
    assert tree_digest(tmp_path) == before


async def test_a_model_override_of_200_characters_fits_the_entry(client: Any, tmp_path: Path) -> None:
    resp = await client.patch(MAIN, json={"label": "l" * 200, "settings": {"model": "m" * 200}})
    assert resp.status == 200, await resp.text()
    await client.close()  # sessions.json is flushed on close
    entries = json.loads((tmp_path / "contexts/sessions.json").read_text())
    entry = entries["sessions"]["agent:main:main"]
    assert entry["settings"]["model"] == "m" * 200
    assert len(json.dumps(entry, ensure_ascii=False).encode()) < 2048


async def test_a_model_override_is_stored_stripped_as_the_model_command_stores_it(client: Any) -> None:
    resp = await client.patch(MAIN, json={"settings": {"model": "  gpt-x "}})
    assert resp.status == 200, await resp.text()
    entry = client.app[K.STORE].entry("agent:main:main")
    assert entry is not None and entry.settings["model"] == "gpt-x"
