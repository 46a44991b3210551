"""Validated, frozen configuration models.

Every key here is documented with its default in ``config/defaults.yaml``; a test checks that the
two list the same keys. Unknown keys are rejected (``extra="forbid"``) so a typo fails at start.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from config.channels import ChannelsSettings
from config.crontab import check_schedule
from config.fields import check_env_name, check_url, check_zone
from config.sizes import parse_threshold


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OpenAICompatSettings(Model):
    enabled: bool = False


class GatewaySettings(Model):
    host: str = "127.0.0.1"
    port: int = Field(8787, ge=0, le=65535)
    tokens: tuple[str, ...] = ()
    max_body_bytes: int = Field(1048576, ge=1024)
    shutdown_timeout_s: float = Field(10, gt=0)
    allowed_hosts: tuple[str, ...] = ()
    max_connections: int = Field(512, ge=1)
    fd_reserve: int = Field(256, ge=0)
    header_timeout_s: float = Field(10, gt=0)
    body_timeout_s: float = Field(60, gt=0)
    max_body_reads_per_peer: int = Field(32, ge=1)
    keepalive_timeout_s: float = Field(15, gt=0)
    openai_compat: OpenAICompatSettings = OpenAICompatSettings()
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    workers: int = Field(1, ge=1, le=64)  # processes on one port (postgres backend only)
    key_handoff: bool = True  # workers: a post goes to the worker that owns its key (gateway/handoff.py)
    key_owner: Literal["hash", "first"] = "hash"  # which worker owns a key: a hash of it, or worker 1 for all

    @property
    def appenders(self) -> int:
        """The workers that store posts: each of ``workers`` (a key's owner by hash), or one."""
        if self.workers > 1 and self.key_handoff and self.key_owner == "first":
            return 1
        return self.workers

    @field_validator("tokens")
    @classmethod
    def _tokens_not_blank(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not token.strip() for token in value):
            raise ValueError("an empty token would let anyone in: remove it or set a secret")
        return value


class LoggingSettings(Model):
    max_bytes: int = Field(10485760, ge=0)
    backup_count: int = Field(5, ge=0)
    repeat_window_s: float = Field(60, ge=0)
    format: Literal["text", "json"] = "text"


class PostgresSettings(Model):
    """``storage.backend: postgres``: where the database is. The password is never in the file:
    it is read from the environment variable ``password_env`` (or libpq's PGPASSWORD)."""

    dsn: str | None = None  # postgresql://user@host:5432/database
    password_env: str = "NEOTASK_PG_PASSWORD"
    pool_size: int = Field(10, ge=1, le=500)
    leader_interval_s: float = Field(2.0, ge=0.1, le=60)  # how often the leader lock is checked or tried
    # keys leased across processes (sessions/postgres/shared.py): null = when gateway.workers > 1;
    # true where several gateways (machines) share one database
    shared: bool | None = None

    _env = field_validator("password_env")(check_env_name)

    @field_validator("dsn")
    @classmethod
    def _check_dsn(cls, value: str | None) -> str | None:
        if not value:
            return None
        how = "write it as postgresql://user@host:5432/database"
        parts = urlsplit(value)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError(f"{value.split('@')[-1]!r} is not a PostgreSQL DSN; {how}")
        if parts.password is not None:
            raise ValueError(
                "storage.postgres.dsn holds a password: remove it from the file and set the environment variable"
                " named by storage.postgres.password_env (NEOTASK_PG_PASSWORD by default)"
            )
        return value


class StorageSettings(Model):
    backend: Literal["files", "postgres"] = "files"  # the session store's backend (sessions.backends.open_store)
    postgres: PostgresSettings = PostgresSettings()
    fsync: Literal["batch", "always", "never"] = "batch"
    sessions_flush_ms: int = Field(1000, ge=0)
    min_free: str | int | None = None  # None: the smaller of 1 GiB and 5 % of the disk
    free_check_ms: int = Field(250, ge=0)

    @field_validator("min_free")
    @classmethod
    def _check_min_free(cls, value: str | int | None) -> str | int | None:
        if value is not None:
            parse_threshold(value)
        return value

    @model_validator(mode="after")
    def _check_backend(self) -> StorageSettings:
        if self.backend == "postgres" and not self.postgres.dsn:
            raise ValueError(
                "storage.backend is postgres but storage.postgres.dsn is not set: set it, e.g."
                " postgresql://neotask@127.0.0.1:5432/neotask"
            )
        return self


class FallbackModel(Model):
    """A model tried when the one before it fails; a field left null is the primary model's."""

    name: str
    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float | None = Field(None, gt=0)
    max_retries: int | None = Field(None, ge=0)

    _url = field_validator("base_url")(check_url)
    _env = field_validator("api_key_env")(check_env_name)


class ModelSettings(Model):
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    name: str = "gpt-4o-mini"
    context_window: int = Field(128000, ge=256)
    max_output_tokens: int = Field(4096, ge=1)
    timeout_s: float = Field(120, gt=0)
    max_retries: int = Field(2, ge=0)
    backoff_s: float = Field(0.5, ge=0)
    retry_after_max_s: float = Field(30, ge=0)
    fallbacks: tuple[FallbackModel, ...] = ()

    _url = field_validator("base_url")(check_url)
    _env = field_validator("api_key_env")(check_env_name)

    @field_validator("fallbacks", mode="before")
    @classmethod
    def _fallback_names(cls, value: object) -> object:
        """A fallback written as a bare string is a model name on the primary's server."""
        if isinstance(value, list | tuple):
            return tuple({"name": item} if isinstance(item, str) else item for item in value)
        return value


class AgentLimits(Model):
    tokens_per_day: int | None = Field(None, ge=1)
    tokens_per_key_per_day: int | None = Field(None, ge=1)


QueueMode = Literal["collect", "followup", "steer"]


class SendRule(Model):
    """One rule of the ``sessions_send`` policy; a field left out matches anything."""

    action: Literal["allow", "deny"] = "deny"
    key_prefix: str | None = None
    channel: str | None = None
    chat_type: Literal["direct", "group", "channel", "cron", "hook"] | None = None


class SessionToolsSettings(Model):
    enabled: bool = True
    visibility: Literal["self", "agent", "all"] = "agent"
    send_rules: tuple[SendRule, ...] = ()
    send_default: Literal["allow", "deny"] = "allow"
    send_timeout_s: float = Field(60, gt=0)
    max_messages: int = Field(50, ge=1, le=500)


class AgentToolsSettings(Model):
    sessions: SessionToolsSettings = SessionToolsSettings()


class AgentSettings(Model):
    workspace: str | None = None
    timezone: str | None = None
    system_prompt: str = "You are a helpful assistant."
    max_tool_rounds: int = Field(8, ge=1)
    max_queued_turns: int = Field(16, ge=1)
    queue_mode: QueueMode | None = None
    model: ModelSettings = ModelSettings()
    tools: AgentToolsSettings = AgentToolsSettings()
    limits: AgentLimits = AgentLimits()

    _zone = field_validator("timezone")(check_zone)


class Binding(Model):
    channel: str
    chat_id: str
    agent: str

    @field_validator("chat_id", mode="before")
    @classmethod
    def _chat_id_as_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int) else value


ResetMode = Literal["daily", "idle", "both", "none"]


class ResetSettings(Model):
    mode: ResetMode = "daily"
    at_hour: int = Field(4, ge=0, le=23)
    timezone: str | None = None
    idle_minutes: float = Field(240, gt=0)
    defer_if_active_minutes: float = Field(30, ge=0)

    _zone = field_validator("timezone")(check_zone)


class ResetOverride(Model):
    mode: ResetMode | None = None
    at_hour: int | None = Field(None, ge=0, le=23)
    timezone: str | None = None
    idle_minutes: float | None = Field(None, gt=0)
    defer_if_active_minutes: float | None = Field(None, ge=0)

    _zone = field_validator("timezone")(check_zone)


ChatType = Literal["direct", "group", "channel", "cron", "hook"]


class QueueSettings(Model):
    mode: QueueMode = "collect"


class SessionSettings(Model):
    dm_scope: Literal["main", "per-peer", "per-channel-peer"] = "main"
    queue: QueueSettings = QueueSettings()
    reset: ResetSettings = ResetSettings()
    reset_by_type: dict[ChatType, ResetOverride] = {}
    reset_by_channel: dict[str, ResetOverride] = {}


class SchedulerSettings(Model):
    sweep_seconds: float = Field(60, gt=0)
    reset_concurrency: int = Field(4, ge=1)


class MemoryFlushSettings(Model):
    enabled: bool = True
    timeout_s: float = Field(60, gt=0)


class CompactionSettings(Model):
    enabled: bool = True
    threshold_ratio: float = Field(0.8, gt=0, le=1)
    token_threshold: int | None = Field(None, ge=1)
    keep_recent: int = Field(10, ge=0)
    min_to_compress: int = Field(5, ge=1)
    model: str | None = None
    memory_flush: MemoryFlushSettings = MemoryFlushSettings()


class InheritanceSettings(Model):
    enabled: bool = True
    expiry_days: float = Field(30, ge=0)
    max_summary_tokens: int = Field(4000, ge=50)


class EmbeddingSettings(Model):
    provider: Literal[
        "auto",
        "minilm+e5+use",
        "minilm+use",
        "e5+use",
        "e5",
        "universal-sentence-encoder",
        "sentence-transformers",
        "openai",
    ] = "auto"
    model: str | None = None
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    dimensions: int | None = Field(None, ge=1)
    batch_size: int = Field(64, ge=1)

    _url = field_validator("base_url")(check_url)
    _env = field_validator("api_key_env")(check_env_name)


class WatchSettings(Model):
    debounce_ms: int = Field(1500, ge=0)
    poll_seconds: float = Field(5, gt=0)


class SearchSettings(Model):
    top_k: int = Field(6, ge=1)
    candidates: int = Field(100, ge=1)
    # Defaults chosen by bench/memory_eval.py (see docs/memory-tuning.md).
    fusion: Literal["score", "rrf"] = "score"
    vector_weight: float = Field(0.2, ge=0)
    text_weight: float = Field(0.8, ge=0)
    text_saturation: float = Field(40.0, gt=0)
    min_score: float = Field(0.055, ge=0, le=1)
    min_text_score: float = Field(0.5, ge=0, le=1)
    recency_half_life_days: float | None = Field(None, gt=0)
    neighbour_weight: float = Field(0.2, ge=0, le=1)
    mmr: float | None = Field(None, ge=0, le=1)  # maximal marginal relevance's lambda; None: off
    min_topic_cosine: float = Field(0.0, ge=0, le=1)  # off-topic query: a topic word nowhere, cosine below; 0: off
    min_topic_score: float = Field(0.2, ge=0, le=1)  # ... and the best result's score below this; 0: off
    speaker_weight: float = Field(0.2, ge=0, le=1)  # a chat turn by a person the query names: score * (1+this)


class RecallSettings(Model):
    enabled: bool = True
    on: Literal["session_start", "every_turn"] = "session_start"
    chat_types: tuple[ChatType, ...] = ("direct",)
    top_k: int = Field(3, ge=1)
    max_tokens: int = Field(1000, ge=1)
    daily_logs: bool = True


class MemorySettings(Model):
    uri: str | None = None
    embedding: EmbeddingSettings = EmbeddingSettings()
    chunk_tokens: int = Field(200, ge=16)
    overlap_tokens: int = Field(40, ge=0)
    extra_paths: tuple[str, ...] = ()
    watch: WatchSettings = WatchSettings()
    search: SearchSettings = SearchSettings()
    recall: RecallSettings = RecallSettings()
    sources: tuple[Literal["memory", "sessions"], ...] = ("memory",)
    scope: Literal["per-peer", "shared"] = "per-peer"

    @model_validator(mode="after")
    def _overlap_below_chunk(self) -> MemorySettings:
        if self.overlap_tokens >= self.chunk_tokens:
            raise ValueError("memory.overlap_tokens must be smaller than memory.chunk_tokens")
        return self


class HistorySettings(Model):
    enabled: bool = True
    max_batch: int = Field(2000, ge=1)
    max_backlog: int = Field(5000, ge=0)  # sessions.history_index.MAX_BACKLOG
    max_limit: int = Field(100, ge=1, le=1000)


class CleanupSettings(Model):
    at_hour: int = Field(3, ge=0, le=23)
    retention_days: float = Field(30, ge=0)
    retention_by_type: dict[ChatType, float] = {}
    archive_retention_days: float | None = Field(None, ge=0)


_JOB_ID = re.compile(r"^[A-Za-z0-9_.@+\-/#]+$")


class CronJob(Model):
    id: str
    schedule: str
    timezone: str | None = None
    agent: str = "main"
    message: str
    isolated: bool = False
    deliver_to: str | None = None
    inherit: bool = False  # isolated firings start without the previous firing's summary unless true

    _deliver_to = field_validator("deliver_to")(check_url)

    @field_validator("id")
    @classmethod
    def _id_is_a_segment(cls, value: str) -> str:
        if not _JOB_ID.match(value):
            raise ValueError(f"cron job id {value!r} must match [A-Za-z0-9_.@+-/#]+")
        return value

    @model_validator(mode="after")
    def _schedule_parses(self) -> CronJob:
        try:
            check_zone(self.timezone)
        except ValueError as exc:
            raise ValueError(f"cron job {self.id!r}: {exc}") from exc
        try:
            check_schedule(self.schedule)  # the grammar scheduler.service builds its triggers from
        except ValueError as exc:
            raise ValueError(f"cron job {self.id!r}: bad schedule {self.schedule!r}: {exc}") from exc
        return self


class CronSettings(Model):
    jobs: tuple[CronJob, ...] = ()

    @model_validator(mode="after")
    def _unique_ids(self) -> CronSettings:
        ids = [job.id for job in self.jobs]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"cron job ids must be unique; repeated: {', '.join(dupes)}")
        return self


class BackupSettings(Model):
    schedule: str | None = None  # a crontab expression in the reset zone; None: no scheduled backups
    keep: int = Field(7, ge=0)  # scheduled and default backups kept in <home>/backups (0 = all)

    @field_validator("schedule")
    @classmethod
    def _schedule_parses(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                check_schedule(value)
            except ValueError as exc:
                raise ValueError(f"bad backup.schedule {value!r}: {exc}") from exc
        return value


class HookMapping(Model):
    secret_env: str | None = None
    key_template: str | None = None
    message_template: str | None = None
    agent: str = "main"
    task_type: str | None = None
    task_identifier: str | None = None
    repository: str | None = None
    user: str | None = None
    deliver_to: str | None = None
    tolerance_s: float = Field(300, gt=0)
    require_timestamp: bool = False

    _deliver_to = field_validator("deliver_to")(check_url)
    _env = field_validator("secret_env")(check_env_name)


class Settings(Model):
    gateway: GatewaySettings = GatewaySettings()
    storage: StorageSettings = StorageSettings()
    agents: dict[str, AgentSettings] = {"main": AgentSettings()}
    bindings: tuple[Binding, ...] = ()
    session: SessionSettings = SessionSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    compaction: CompactionSettings = CompactionSettings()
    inheritance: InheritanceSettings = InheritanceSettings()
    memory: MemorySettings = MemorySettings()
    history: HistorySettings = HistorySettings()
    cleanup: CleanupSettings = CleanupSettings()
    cron: CronSettings = CronSettings()
    hooks: dict[str, HookMapping] = {}
    logging: LoggingSettings = LoggingSettings()
    channels: ChannelsSettings = ChannelsSettings()
    backup: BackupSettings = BackupSettings()

    @model_validator(mode="after")
    def _references_exist(self) -> Settings:
        for agent_id in self.agents:
            if not _JOB_ID.match(agent_id) or ":" in agent_id:
                raise ValueError(f"agents.{agent_id}: an agent id must match [A-Za-z0-9_.@+-/#]+")
        for i, binding in enumerate(self.bindings):
            if binding.agent not in self.agents:
                raise ValueError(f"bindings[{i}].agent {binding.agent!r} is not a configured agent")
        for job in self.cron.jobs:
            if job.agent not in self.agents:
                raise ValueError(f"cron.jobs[{job.id}].agent {job.agent!r} is not a configured agent")
        for name, hook in self.hooks.items():
            if hook.agent not in self.agents:
                raise ValueError(f"hooks.{name}.agent {hook.agent!r} is not a configured agent")
        for platform, name, account in self.channels.accounts():
            if account.agent not in self.agents:
                where = f"channels.{platform}.accounts.{name}.agent"
                raise ValueError(f"{where} {account.agent!r} is not a configured agent")
        return self

    def agent(self, agent_id: str) -> AgentSettings:
        return self.agents[agent_id]
