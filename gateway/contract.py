"""A route's contract, written beside its handler.

``@operation(...)`` under ``@routes.get(...)`` says what a handler takes and answers: its summary,
its body (the pydantic model the handler validates with), its query and header parameters (the
``Param`` objects the handler reads and validates with), its answer schema and the error classes it
can raise. ``gateway/openapi.py`` only assembles the document from the registered handlers, so a
limit, an enum or an error code is written once and the published schema cannot drift from the
validation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import unquote_plus, unquote_to_bytes

from aiohttp import web
from pydantic import BaseModel, TypeAdapter

from config.errors import (
    BadRequest,
    Busy,
    InsufficientStorage,
    InvalidKey,
    NeotaskError,
    ProviderFailure,
    RunClosing,
    RunNotFound,
    SessionPaused,
    ShuttingDown,
    StorageUnavailable,
    TokenBudgetExhausted,
    TurnFailed,
)

Schema = dict[str, Any]
Errors = tuple[type[NeotaskError], ...]
H = TypeVar("H", bound=Callable[..., Any])
STR: Schema = {"type": "string"}
NULLABLE_STR: Schema = {"type": ["string", "null"]}
OBJ: Schema = {"type": "object"}
ATTRIBUTE = "__neotask_operation__"

# What a posted message can meet once its key is valid (SPEC section 4); shared by every route
# that runs a turn.
TURN_ERRORS: Errors = (
    SessionPaused, RunClosing, Busy, ProviderFailure, ShuttingDown, InsufficientStorage, StorageUnavailable,
    TurnFailed, TokenBudgetExhausted,
)  # fmt: skip


@dataclass(frozen=True)
class Answer:
    """A named answer schema (a ``components/schemas`` entry); ``parts`` are the answers its
    ``$ref``s name, so the document carries them too."""

    name: str
    schema: Schema
    parts: tuple[Answer, ...] = ()

    @property
    def ref(self) -> Schema:
        return ref(self.name)


def typed(
    name: str, typ: type, *, add: Schema | None = None, replace: Schema | None = None, required: tuple[str, ...] = ()
) -> Answer:
    """The answer schema of a typed value (a dataclass or TypedDict the handler serializes), derived
    by pydantic from its annotations, so a field added to the type is a field documented. ``add``:
    the properties a view adds to it; ``replace``: those it serializes differently; ``required``:
    for a ``total=False`` TypedDict, the keys that are always there."""
    schema: Schema = TypeAdapter(typ).json_schema(mode="serialization")
    assert "$defs" not in schema, f"{typ.__name__}: a nested type; give it an Answer of its own"
    properties: Schema = {
        field_name: {k: v for k, v in prop.items() if k not in ("title", "default")}
        for field_name, prop in schema.get("properties", {}).items()
    }
    properties.update(replace or {})
    properties.update(add or {})
    out: Schema = {"type": "object", "properties": properties}
    if schema.get("description"):
        out["description"] = " ".join(str(schema["description"]).split())
    needed = [n for n in schema.get("required", []) if n in properties] + [n for n in required if n in properties]
    if needed:
        out["required"] = list(dict.fromkeys(needed))
    return Answer(name, out)


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def page(name: str, items: str, item: Answer) -> Answer:
    """The answer of a listing's page: ``items``, a list of ``item``, and ``next_cursor``, what the
    next page's ``cursor`` is (null on the last page)."""
    listed: Schema = {"type": "array", "items": item.ref}
    return Answer(name, {"type": "object", "properties": {items: listed, "next_cursor": NULLABLE_STR}}, parts=(item,))


OBJECT = Answer("Object", OBJ)


def either(choices: tuple[str, ...]) -> str:
    return choices[0] if len(choices) == 1 else f"{', '.join(choices[:-1])} or {choices[-1]}"


@dataclass(frozen=True, eq=False)
class Param:
    """A query or header parameter; the subclasses read and validate it too."""

    name: str
    description: str
    where: Literal["query", "header", "path"] = "query"
    required: bool = False
    schema: Schema = field(default_factory=lambda: dict(STR))

    def raw(self, request: web.Request) -> str | None:
        return request.headers.get(self.name) if self.where == "header" else request.query.get(self.name)

    def text(self, request: web.Request) -> str | None:
        """The query parameter as text, refused when its percent-encoded bytes are not UTF-8 (the
        server would read them as U+FFFD and search for that) or hold a NUL or a lone surrogate."""
        raw = self.raw(request)
        if raw is None or self.where != "query":
            return raw
        for pair in request.rel_url.raw_query_string.split("&"):
            name, _, value = pair.partition("=")
            if unquote_plus(name) != self.name:
                continue
            try:
                unquote_to_bytes(value.replace("+", " ")).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise self.refuse(
                    f"is not valid UTF-8 (byte {exc.start} of the value): percent-encode the text's UTF-8 bytes"
                ) from None
            break  # the first one is the one read
        if "\x00" in raw:
            raise self.refuse("holds a NUL character (%00): send text only")
        return raw

    def refuse(self, why: str) -> BadRequest:
        what = f"query parameter '{self.name}'" if self.where == "query" else f"the {self.name} header"
        return BadRequest(f"{what} {why}", field=self.name)


@dataclass(frozen=True, eq=False, kw_only=True)
class IntParam(Param):
    """An integer in [low, high]; ``high`` or ``default`` None: given by the settings at read time."""

    default: int | None
    low: int
    high: int | None

    def __post_init__(self) -> None:
        schema: Schema = {"type": "integer", "minimum": self.low}
        if self.high is not None:
            schema["maximum"] = self.high
        if self.default is not None:
            schema["default"] = self.default
        object.__setattr__(self, "schema", schema)

    def read(self, request: web.Request, *, high: int | None = None, default: int | None = None) -> int:
        top = high if high is not None else self.high
        fallback = default if default is not None else self.default
        assert top is not None and fallback is not None, f"{self.name}: no bound or default given"
        raw = self.raw(request)
        if raw is None or raw == "":
            return fallback
        # ASCII digits only: int() also takes " 5", "+5", "1_0" and digits of other scripts (full-width, Arabic-Indic)
        if not (raw.isascii() and raw.lstrip("-").isdigit() and raw.count("-") <= 1):
            raise self.refuse("must be an integer (ASCII digits, e.g. 10)")
        value = int(raw)
        if not self.low <= value <= top:
            raise self.refuse(f"must be between {self.low} and {top}")
        return value


@dataclass(frozen=True, eq=False, kw_only=True)
class ChoiceParam(Param):
    """One of ``choices`` (``many``: a comma-separated list of them). ``blank``: an empty value
    counts as absent (else it is refused like any value not among the choices)."""

    choices: tuple[str, ...]
    default: str | None = None
    many: bool = False
    blank: bool = True

    def __post_init__(self) -> None:
        schema: Schema = {"type": "string", "enum": list(self.choices)}
        if self.many:
            schema = {"type": "string", "description": f"comma-separated: {', '.join(self.choices)}"}
        if self.default is not None:
            schema["default"] = self.default
        object.__setattr__(self, "schema", schema)

    def read(self, request: web.Request) -> str | None:
        raw = self.raw(request)
        if raw is None or (raw == "" and self.blank):
            return self.default
        if raw not in self.choices:
            raise BadRequest(f"'{self.name}' must be {either(self.choices)}", field=self.name)
        return raw

    def read_many(self, request: web.Request) -> list[str]:
        values = [v for v in (self.raw(request) or "").split(",") if v]
        if any(v not in self.choices for v in values):
            raise BadRequest(f"'{self.name}' must be among {', '.join(self.choices)}", field=self.name)
        return values


@dataclass(frozen=True, eq=False, kw_only=True)
class FlagParam(Param):
    """A boolean: ``true`` or ``1``; ``false`` or ``0``; absent is false. An empty value
    (``?purge`` or ``?purge=``) is refused: it was taken for true, and the one flag is
    ``purge``, which erases for good (a script's unset variable in ``purge=$P`` purged)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "schema", {"type": "boolean", "default": False})

    def read(self, request: web.Request) -> bool:
        raw = self.raw(request)
        if raw is None or raw in ("false", "0"):
            return False
        if raw in ("true", "1"):
            return True
        got = "an empty value" if raw == "" else f"{raw[:40]!r}"
        raise BadRequest(f"'{self.name}' must be true or false, not {got}", field=self.name)


LIMIT = IntParam("limit", "page size", default=50, low=1, high=500)
CURSOR = Param("cursor", "`next_cursor` of the previous page (opaque)")
AGENT = Param("agent", "agent id")

# Path parameters, by name, and the errors their parsing raises.
PATH_PARAMS: dict[str, Param] = {
    "key": Param("key", "the session key as ONE percent-encoded segment (`:` as %3A, `/` as %2F)", "path", True),
    "uuid": Param("uuid", "the run id", "path", True, {"type": "string", "format": "uuid"}),
    "job_id": Param("job_id", "a job id of GET /v1/scheduler/jobs", "path", True),
}
PATH_ERRORS: dict[str, Errors] = {"key": (InvalidKey,), "uuid": (RunNotFound,)}


@dataclass(frozen=True)
class Operation:
    """What one handler takes and answers."""

    summary: str
    tag: str
    description: str = ""
    body: type[BaseModel] | Schema | None = None  # the handler's pydantic model, or a plain schema
    body_required: bool = True
    params: tuple[Param, ...] = ()
    status: int = 200
    answer: Answer | None = OBJECT  # None: no JSON body (see ``media``)
    media: str = "application/json"
    stream: Answer | None = None  # `stream: true` in the body answers these server-sent events instead
    errors: Errors = ()
    extra_answers: tuple[tuple[int, Answer, str], ...] = ()  # (status, answer, description)


def operation(summary: str, tag: str, description: str = "", **fields: Any) -> Callable[[H], H]:
    """Describe the handler below (put it under ``@routes.<method>(...)``)."""
    described = Operation(summary, tag, description, **fields)

    def mark(handler: H) -> H:
        setattr(handler, ATTRIBUTE, described)
        return handler

    return mark


def operation_of(handler: Any) -> Operation | None:
    found = getattr(handler, ATTRIBUTE, None)
    return found if isinstance(found, Operation) else None
