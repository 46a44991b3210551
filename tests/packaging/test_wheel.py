"""The wheel stands alone: built from this checkout, installed (not editable) into a new venv and
run from another folder, its ``neotask`` finds its own defaults, console files and version, writes a
home with ``init``, and its gateway answers through a model.

Marker ``packaging``: ``make test-packaging`` (and CI) runs it, ``make test`` does not (about 10 s
of wall clock: the build, the venv, one CLI and one daemon). The venv borrows the dependencies of
the running interpreter's environment through a ``.pth`` line (no torch download); a ``.pth`` line
adds a folder without running that folder's own ``.pth`` files, so the editable install of the
checkout there stays invisible and every ``neotask`` module comes from the wheel."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest

from tests.gateway.daemons import Daemon, child_env
from tests.packaging.test_package_data import REPO, data_files, packages_and_data
from tests.support.openai_server import OpenAIServer

pytestmark = [pytest.mark.packaging, pytest.mark.slow]
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")


def _run(*command: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return str(done.stdout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv with the wheel of the working tree installed; its bin/ folder."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    roots, _ = packages_and_data()
    for package in roots:
        shutil.copytree(REPO / package, source / package, ignore=SKIP)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run(*pip, "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", root / "dist", "./source", cwd=root)
    (wheel,) = (root / "dist").glob("neotask-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {str(p.relative_to(REPO)) for p in data_files()} <= names  # every data file is in it
    venv = root / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=root)
    python = venv / "bin" / "python"
    _run(*pip, "--python", python, "install", "--no-deps", "--quiet", wheel, cwd=root)
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=root).strip())
    shared = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "shared-dependencies.pth").write_text("".join(f"{path}\n" for path in sorted(shared)))
    return venv / "bin"


def test_the_installed_package_is_the_wheel_and_finds_its_files(installed: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    roots, _ = packages_and_data()
    probe = (
        "import importlib, importlib.resources as r, importlib.metadata as m\n"
        f"for name in {roots!r}: print(importlib.import_module(name).__file__)\n"
        "print(m.distribution('neotask').locate_file(''))\n"
        "print(len(r.files('config').joinpath('defaults.yaml').read_text()))\n"
        "import gateway.api.ui as ui; print(sorted(p.name for p in ui.STATIC.iterdir())[:3])\n"
    )
    lines = _run(installed / "python", "-c", probe, cwd=elsewhere, env=child_env()).splitlines()
    site = installed.parent / "lib"
    assert all(Path(line).is_relative_to(site) for line in lines[: len(roots) + 1]), lines
    assert int(lines[-2]) > 1000 and lines[-1] == "['api.js', 'app.css', 'app.js']"
    version = _run(installed / "neotask", "--version", cwd=elsewhere).strip()
    assert version == f"neotask {_project_version()}"


def _project_version() -> str:
    import tomllib

    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


async def test_init_then_the_gateway_answers_through_a_model(installed: Path, tmp_path: Path) -> None:
    """The first five minutes, from the installed command: init (asking the model once), then the
    gateway, its console and a message answered by the model."""
    elsewhere, home = tmp_path / "elsewhere", tmp_path / "home"
    elsewhere.mkdir()
    env = child_env(MODEL_KEY="sk-local", NEOTASK_MEMORY__RECALL__ENABLED="false")  # recall would load torch
    async with OpenAIServer(api_key="sk-local") as server:
        init = await asyncio.create_subprocess_exec(
            installed / "neotask", "init", "--non-interactive", "--home", str(home), "--base-url", server.base_url,
            "--model", "test-model", "--api-key-env", "MODEL_KEY", "--check-model",
            cwd=elsewhere, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(init.communicate(), 60)
        assert init.returncode == 0, err.decode()
        assert f"neotask gateway --home {home}" in out.decode()
        stderr = tmp_path / "gateway.stderr"
        with stderr.open("wb") as sink:
            proc = await asyncio.create_subprocess_exec(
                installed / "neotask", "gateway", "--home", str(home), "--port", "0",
                cwd=elsewhere, env=env, stdout=asyncio.subprocess.PIPE, stderr=sink,
            )  # fmt: skip
        gateway = Daemon(home, proc, stderr)
        try:
            url = await gateway.wait_listening(60)
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{url}/ui") as page:
                    assert page.status == 200 and '<html lang="en" data-auth="none">' in await page.text()
                async with http.get(f"{url}/ui/app.js") as script:
                    assert script.status == 200 and len(await script.read()) > 100
                key = quote("agent:main:main", safe="")
                async with http.post(f"{url}/v1/sessions/{key}/messages", json={"content": "hello"}) as answered:
                    assert answered.status == 200, await answered.text()
                    assert (await answered.json())["reply"]["content"] == "echo: hello"
            assert await gateway.stop() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await gateway.wait()
    assert len(server.chat_requests) == 2  # init's check, then the message
