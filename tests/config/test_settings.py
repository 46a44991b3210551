"""Configuration: defaults.yaml and the models agree; merge order; env; failing fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel

from config.errors import ConfigError
from config.loader import load_config, load_defaults
from config.settings import Settings


def model_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        keys.add(path)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys |= model_keys(annotation, path + ".")
        elif get_origin(annotation) is dict and path == "agents":
            value = get_args(annotation)[1]
            keys |= {"agents.main"} | model_keys(value, "agents.main.")
    return keys


def yaml_keys(data: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for name, value in data.items():
        path = f"{prefix}{name}"
        keys.add(path)
        if isinstance(value, dict) and value and path not in {"hooks"}:
            keys |= yaml_keys(value, path + ".")
    return keys


def test_defaults_yaml_and_the_models_list_the_same_keys() -> None:
    assert yaml_keys(load_defaults()) == model_keys(Settings)


def test_defaults_yaml_values_are_the_model_defaults() -> None:
    from_yaml = load_config(env={}, home="/nonexistent-home").settings
    assert from_yaml == Settings()


def test_every_contract_key_of_the_spec_is_present() -> None:
    keys = yaml_keys(load_defaults())
    for key in [
        "gateway.host", "gateway.port", "gateway.tokens", "gateway.max_body_bytes", "storage.fsync",
        "storage.sessions_flush_ms", "agents.main.workspace", "agents.main.timezone", "agents.main.system_prompt",
        "agents.main.max_tool_rounds", "agents.main.max_queued_turns", "agents.main.model.base_url",
        "agents.main.model.api_key_env", "agents.main.model.name", "agents.main.model.context_window",
        "agents.main.model.max_output_tokens", "agents.main.model.timeout_s", "agents.main.model.max_retries",
        "bindings", "session.dm_scope", "session.reset.mode", "session.reset.at_hour", "session.reset.timezone",
        "session.reset.idle_minutes", "session.reset.defer_if_active_minutes", "session.reset_by_type",
        "session.reset_by_channel", "scheduler.sweep_seconds", "compaction.enabled", "compaction.threshold_ratio",
        "compaction.token_threshold", "compaction.keep_recent", "compaction.min_to_compress", "compaction.model",
        "compaction.memory_flush.enabled", "inheritance.enabled", "inheritance.expiry_days",
        "inheritance.max_summary_tokens", "memory.uri", "memory.embedding.provider", "memory.embedding.model",
        "memory.chunk_tokens", "memory.overlap_tokens", "memory.extra_paths", "memory.search.top_k",
        "memory.search.candidates", "memory.search.vector_weight", "memory.search.text_weight",
        "memory.search.min_score", "memory.search.min_text_score", "memory.recall.enabled", "memory.recall.on",
        "memory.recall.chat_types", "memory.recall.top_k", "memory.recall.max_tokens", "memory.recall.daily_logs",
        "cleanup.at_hour", "cleanup.retention_days", "cleanup.retention_by_type", "cleanup.archive_retention_days",
        "cron.jobs", "hooks",
    ]:  # fmt: skip
        assert key in keys, key


def test_precedence_flag_over_env_over_yaml_over_defaults(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("gateway: {port: 9100, host: 127.0.0.2}\nstorage: {fsync: always}\n")
    env = {"NEOTASK_GATEWAY__PORT": "9200", "NEOTASK_STORAGE__FSYNC": "never"}
    loaded = load_config(env=env, home=tmp_path, overrides={"gateway": {"port": 9300}})
    assert loaded.settings.gateway.port == 9300
    assert loaded.settings.storage.fsync == "never"
    assert loaded.settings.gateway.host == "127.0.0.2"
    assert loaded.settings.gateway.max_body_bytes == 1048576


def test_mappings_merge_and_lists_replace(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "memory: {recall: {chat_types: [direct, group]}}\nagents: {work: {model: {name: small}}}\n"
    )
    settings = load_config(env={}, home=tmp_path).settings
    assert settings.memory.recall.chat_types == ("direct", "group")
    assert settings.memory.recall.top_k == 3
    assert set(settings.agents) == {"main", "work"}
    assert settings.agents["work"].model.name == "small"
    assert settings.agents["work"].model.context_window == 128000  # defaults from main


def test_empty_file_is_an_empty_mapping(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("")
    assert load_config(env={}, home=tmp_path).settings == Settings()


def test_env_values_are_yaml_scalars_and_unknown_names_warn(tmp_path: Path) -> None:
    env = {
        "NEOTASK_GATEWAY__TOKENS": "[a, b]",
        "NEOTASK_SESSION__RESET__IDLE_MINUTES": "0.5",
        "NEOTASK_COMPACTION__ENABLED": "false",
        "NEOTASK_NOT_A_KEY": "1",
        "NEOTASK_TOKEN": "cli-token",
    }
    loaded = load_config(env=env, home=tmp_path)
    assert loaded.settings.gateway.tokens == ("a", "b")
    assert loaded.settings.session.reset.idle_minutes == 0.5
    assert loaded.settings.compaction.enabled is False
    assert loaded.warnings == ("ignoring NEOTASK_NOT_A_KEY: it names no configuration key",)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("gateway: {prot: 1}", "gateway.prot: unknown key; allowed keys here: host, port"),
        ("storage: {fsync: sometimes}", "storage.fsync"),
        ("session: {reset: {at_hour: 25}}", "session.reset.at_hour"),
        ("session: {reset: {timezone: Mars/Olympus}}", "unknown time zone"),
        ("bindings: [{channel: tg, chat_id: 1, agent: ghost}]", "bindings[0].agent 'ghost' is not a configured agent"),
        ("cron: {jobs: [{id: j1, schedule: 'not cron', message: hi}]}", "cron job 'j1': bad schedule"),
        ("cron: {jobs: [{id: j2, schedule: '0 9 * * *', timezone: Nowhere/City, message: hi}]}",
         "cron job 'j2': unknown time zone 'Nowhere/City'"),
        ("memory: {chunk_tokens: 50, overlap_tokens: 60}", "overlap_tokens must be smaller"),
        ("[1, 2]", "must hold a mapping"),
        ("gateway: {port: [", "not valid YAML"),
    ],
)
def test_bad_config_fails_fast_naming_the_key(tmp_path: Path, text: str, named: str) -> None:
    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(env={}, home=tmp_path)
    assert named in info.value.message


def test_explicit_config_path_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(env={}, home=tmp_path, config_path=tmp_path / "nope.yaml")


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(ValueError):
        settings.gateway.port = 1  # type: ignore[misc]
