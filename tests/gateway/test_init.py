"""``neotask init``: the home and its first config.yaml, from flags (``--non-interactive``) or from
answers typed on a terminal; a bad answer changes nothing on disk."""

from __future__ import annotations

import asyncio
import os
import re
import select
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from config.loader import load_config, parse_yaml
from gateway.cli import main
from gateway.cli_init import ask
from gateway.first_config import Answers, data, render, tree
from tests.gateway.daemons import REPO, child_env
from tests.support.openai_server import OpenAIServer

pytestmark = pytest.mark.realtime  # one test drives the real CLI process on a terminal


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["init", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_non_interactive_writes_a_commented_private_config_that_config_check_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    home = tmp_path / "new" / "home"
    code, out, err = run(
        capsys, "--non-interactive", "--home", str(home), "--base-url", "http://127.0.0.1:11434/v1/",
        "--model", "llama3.1:8b", "--slack-bot-token-env", "MY_SLACK_BOT", "--reset", "daily", "--reset-hour", "6",
    )  # fmt: skip
    assert code == 0, err
    target = home / "config.yaml"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700 and stat.S_IMODE(target.stat().st_mode) == 0o600
    text = target.read_text()
    keys = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert keys and all(re.search(r"\S\s+# \S", line) for line in keys), text  # a comment on every key
    assert parse_yaml(text) == {
        "agents": {"main": {"model": {"base_url": "http://127.0.0.1:11434/v1", "name": "llama3.1:8b",
                                      "api_key_env": "OPENAI_API_KEY"}}},
        "session": {"reset": {"mode": "daily", "at_hour": 6}},
        "channels": {"slack": {"accounts": {"main": {"bot_token_env": "MY_SLACK_BOT",
                                                     "app_token_env": "SLACK_APP_TOKEN", "dm_policy": "pairing"}}}},
    }  # fmt: skip
    assert f"wrote {target}" in out
    assert "export OPENAI_API_KEY=..." in out and "export MY_SLACK_BOT=..." in out  # what is unset, named
    assert f"neotask gateway --home {home}" in out  # the next command
    capsys.readouterr()
    assert main(["config", "check", "--home", str(home)]) == 0
    assert f"OK: {target}" in capsys.readouterr().out


def test_discord_and_matrix_accounts_are_offered_and_config_check_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MATRIX_ACCESS_TOKEN", raising=False)
    home = tmp_path / "h"
    code, out, err = run(
        capsys, "--non-interactive", "--home", str(home), "--discord-token-env", "MY_DISCORD",
        "--matrix-homeserver", "https://matrix.example.org/", "--matrix-user-id", "@neo:example.org",
    )  # fmt: skip
    assert code == 0, err
    assert parse_yaml((home / "config.yaml").read_text())["channels"] == {
        "discord": {"accounts": {"main": {"token_env": "MY_DISCORD", "dm_policy": "pairing"}}},
        "matrix": {"accounts": {"main": {"homeserver": "https://matrix.example.org", "user_id": "@neo:example.org",
                                         "access_token_env": "MATRIX_ACCESS_TOKEN", "dm_policy": "pairing"}}},
    }  # fmt: skip
    assert "export MY_DISCORD=..." in out and "export MATRIX_ACCESS_TOKEN=..." in out
    assert "start a direct chat with the bot user" in out and "neotask channels approve CODE" in out
    capsys.readouterr()
    assert main(["config", "check", "--home", str(home)]) == 0, capsys.readouterr()


def test_store_only_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--non-interactive", "--home", str(tmp_path / "h"))
    assert code == 0, err
    loaded = load_config(env={}, home=tmp_path / "h")
    assert loaded.settings.agents["main"].model.base_url is None
    assert loaded.settings.session.reset.mode == "daily" and not loaded.settings.channels.telegram.accounts
    assert "export" not in out  # no secret to set


def test_an_existing_config_is_kept_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "h"
    home.mkdir(mode=0o700)
    (home / "config.yaml").write_text("gateway:\n  port: 9999\n")
    code, _, err = run(capsys, "--non-interactive", "--home", str(home), "--reset", "none")
    assert code == 1 and "config.yaml exists: it is kept; pass --force" in err
    assert (home / "config.yaml").read_text() == "gateway:\n  port: 9999\n"
    code, _, err = run(capsys, "--non-interactive", "--home", str(home), "--reset", "none", "--force")
    assert code == 0, err
    assert parse_yaml((home / "config.yaml").read_text()) == {
        "agents": {"main": {"model": {"base_url": None}}},
        "session": {"reset": {"mode": "none"}},
    }
    assert sorted(p.name for p in home.iterdir()) == ["config.yaml"]  # no temporary file left


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--base-url", "localhost:11434"], "--base-url: 'localhost:11434' is not an http:// or https:// URL"),
        (["--api-key-env", "sk-proj-abcdefghijklmnop"], "--api-key-env: 'sk-p...' is not an environment variable"),
        (["--telegram-token-env", "123456:ABC"], "--telegram-token-env: '123456:ABC' is not an environment variable"),
        (["--reset", "weekly"], "--reset: 'weekly' is not a reset policy: one of daily, idle, both, none"),
        (["--reset-hour", "24"], "--reset-hour: '24' is not an hour"),
        (["--idle-minutes", "-5"], "--idle-minutes: '-5' is not a number of minutes above 0"),
        (["--model", "gpt 4"], "--model: 'gpt 4' is not a model name"),
        (["--check-model"], "--check-model needs a model"),
        (["--matrix-homeserver", "https://m.example.org"], "--matrix-user-id: a Matrix account needs the bot"),
        (
            ["--matrix-homeserver", "https://m.example.org", "--matrix-user-id", "bot"],
            "--matrix-user-id: 'bot' is not a Matrix user id",
        ),
    ],
)
def test_a_bad_answer_is_refused_with_the_reason_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], reason: str
) -> None:
    code, out, err = run(capsys, "--non-interactive", "--home", str(tmp_path / "h"), *flags)
    assert code == 2, (out, err)
    assert err.startswith("error: ") and reason in err, err
    assert "sk-proj-abcdefghijklmnop" not in err  # a secret typed by mistake is not echoed whole
    assert list(tmp_path.iterdir()) == []


def test_a_configuration_config_check_refuses_is_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file with this environment is what the daemon would load: a public address without tokens."""
    monkeypatch.setenv("NEOTASK_GATEWAY__HOST", "0.0.0.0")
    code, _, err = run(capsys, "--non-interactive", "--home", str(tmp_path / "h"))
    assert code == 4 and "refusing to listen on 0.0.0.0 without a token" in err, err
    assert list(tmp_path.iterdir()) == []


def test_without_a_terminal_it_asks_for_the_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--home", str(tmp_path / "h"))  # pytest's stdin is no terminal
    assert code == 2 and "not a terminal: give the answers as flags with --non-interactive" in err
    assert list(tmp_path.iterdir()) == []


def test_a_wider_home_is_made_private(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "h"
    home.mkdir()
    home.chmod(0o755)
    code, out, _ = run(capsys, "--non-interactive", "--home", str(home))
    assert code == 0 and stat.S_IMODE(home.stat().st_mode) == 0o700
    assert "was mode 0755: now 0700" in out


async def test_check_model_makes_one_request_and_a_failure_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCAL_KEY", raising=False)
    async with OpenAIServer(api_key="sk-local-1") as server:
        args = ["--non-interactive", "--home", str(tmp_path / "h"), "--base-url", server.base_url,
                "--model", "test-model", "--api-key-env", "LOCAL_KEY", "--check-model"]  # fmt: skip
        code, _, err = await asyncio.to_thread(run, capsys, *args)
        assert code == 1 and "the model did not answer" in err and "set the environment variable LOCAL_KEY" in err
        assert "nothing was written" in err and list(tmp_path.iterdir()) == []
        assert len(server.chat_requests) == 1  # one request, no retries

        monkeypatch.setenv("LOCAL_KEY", "sk-local-1")
        code, out, err = await asyncio.to_thread(run, capsys, *args)
        assert code == 0, err
        assert f"the model test-model at {server.base_url} answered" in out
        assert len(server.chat_requests) == 2 and (tmp_path / "h" / "config.yaml").exists()
        assert "export LOCAL_KEY" not in out  # set already


def test_asking_again_after_a_bad_answer() -> None:
    typed = iter(["ftp://x", "http://127.0.0.1:8000/v1", "", "", "none", "", "", "", "idle", "0", "30"])
    prompts: list[str] = []
    said: list[str] = []

    def asker(prompt: str) -> str:
        prompts.append(prompt)
        return next(typed)

    answers = ask(Answers(), asker, said.append)
    assert answers == Answers(base_url="http://127.0.0.1:8000/v1", reset="idle", idle_minutes=30)
    assert said == [
        "  not taken: 'ftp://x' is not an http:// or https:// URL; write it whole, e.g. http://127.0.0.1:11434/v1 "
        "or https://example.com/hook",
        "  not taken: '0' is not a number of minutes above 0 (e.g. 240)",
    ]
    assert prompts[2].startswith("The model's name [gpt-4o-mini]")
    assert not any("hour" in p for p in prompts)  # an idle policy has no daily hour
    assert not any("app-level" in p for p in prompts)  # no Slack: not asked for its app token


@pytest.mark.parametrize("name", ["null", "true", "1.5", "on", "~", "a#b", "@x", "'q", "no", "0x1F", "2026-01-01"])
def test_every_value_reads_back_as_given(name: str) -> None:
    answers = Answers(base_url="http://h:1/v1", model=name)
    assert parse_yaml(render(answers, written_by="a test")) == data(tree(answers))
    assert data(tree(answers))["agents"]["main"]["model"]["name"] == name


def _read_until(fd: int, pattern: str, seen: list[str], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while pattern not in "".join(seen):
        left = deadline - time.monotonic()
        assert left > 0, f"waited for {pattern!r}; the terminal shows:\n{''.join(seen)}"
        if select.select([fd], [], [], left)[0]:
            try:
                seen.append(os.read(fd, 4096).decode(errors="replace"))
            except OSError:  # the process closed the terminal
                raise AssertionError(f"waited for {pattern!r}; the terminal shows:\n{''.join(seen)}") from None


def test_on_a_terminal_it_asks_each_question(tmp_path: Path) -> None:
    """The real command on a pseudo-terminal (one CLI process, about 1 s of CPU)."""
    home = tmp_path / "h"
    leader, follower = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "init", "--home", str(home), "--model", "m1"],
        stdin=follower, stdout=follower, stderr=follower, cwd=REPO, env=child_env(), close_fds=True,
    )  # fmt: skip
    os.close(follower)
    seen: list[str] = []
    try:
        for prompt, answer in [
            ("base URL", "not a url"),
            ("not taken: 'not a url'", "http://127.0.0.1:11434/v1"),
            ("The model's name [m1]", ""),
            ("API key [OPENAI_API_KEY]", "OLLAMA_KEY"),
            ("Telegram", "TG_BOT"),
            ("Slack", ""),
            ("Discord", ""),
            ("Matrix: the homeserver", ""),
            ("Reset policy", "both"),
            ("hour of the daily reset", "5"),
            ("Minutes idle", "45"),
        ]:
            _read_until(leader, prompt, seen)
            seen.append("\n")  # what follows is an answer to the next prompt
            os.write(leader, answer.encode() + b"\r")
        _read_until(leader, "neotask gateway --home", seen)
        assert proc.wait(timeout=20) == 0, "".join(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    assert parse_yaml((home / "config.yaml").read_text()) == {
        "agents": {"main": {"model": {"base_url": "http://127.0.0.1:11434/v1", "name": "m1",
                                      "api_key_env": "OLLAMA_KEY"}}},
        "session": {"reset": {"mode": "both", "at_hour": 5, "idle_minutes": 45}},
        "channels": {"telegram": {"accounts": {"main": {"token_env": "TG_BOT", "dm_policy": "pairing"}}}},
    }  # fmt: skip


def test_version_is_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"neotask {version('neotask')}"
