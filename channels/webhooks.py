"""Webhook mappings as pure functions (SPEC section 8): ``${dotted.path}`` templates over a JSON
payload, the HMAC-SHA256 signature of the raw body, and the plan a mapping makes of a payload (the
session key, the message and the seed's task key columns). The route in ``gateway/api/hooks.py``
does the I/O.

Template syntax: ``${a.b.0.c}`` is replaced by the value at that path (dict keys and list
indices); ``$$`` writes a literal ``$`` (so ``$${`` is a literal ``${``); any other ``$`` is
literal. A string value is inserted as is, null as the empty string, numbers and booleans as JSON,
objects and lists as compact JSON.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import json
import re
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from config.errors import BadRequest, InvalidKey
from config.settings import HookMapping
from sessions.keys import SessionKey, escape_segment, hook_key, parse_key
from sessions.records import TaskKey

SIGNATURE_PREFIX = "sha256="
_PLACEHOLDER = re.compile(r"\$\$|\$\{([^}]*)\}|\$\{")
_PATH = re.compile(r"[^.\s{}$]+(?:\.[^.\s{}$]+)*")


class TemplateError(ValueError):
    """A template that cannot be rendered whatever the payload (a configuration mistake)."""


class MissingPath(LookupError):
    """The payload has nothing at ``path``; ``reason`` says where the walk stopped."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def lookup(payload: Any, path: str) -> Any:
    """The value at a dotted ``path``: ``lookup({"a": [{"b": 1}]}, "a.0.b") == 1``."""
    value = payload
    walked: list[str] = []
    for part in path.split("."):
        where = ".".join(walked) or "the payload"
        if isinstance(value, dict):
            if part not in value:
                raise MissingPath(path, f"{where} has no key {part!r}")
            value = value[part]
        elif isinstance(value, list):
            if not part.isdigit():
                raise MissingPath(path, f"{where} is a list; {part!r} is not an index")
            if int(part) >= len(value):
                raise MissingPath(path, f"{where} has {len(value)} items; index {part} is out of range")
            value = value[int(part)]
        else:
            raise MissingPath(path, f"{where} is {_kind(value)}, not an object or a list")
        walked.append(part)
    return value


def text_of(value: Any) -> str:
    """How a looked-up value appears in rendered text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def placeholders(template: str) -> list[str]:
    """The paths a template refers to, in order; TemplateError when its syntax is wrong."""
    paths = []
    for match in _PLACEHOLDER.finditer(template):
        if match.group(0) == "$$":
            continue
        path = match.group(1)
        if path is None:
            raise TemplateError(f"'${{' at position {match.start()} has no closing '}}' (write '$${{' for a literal)")
        if not _PATH.fullmatch(path):
            raise TemplateError(f"'${{{path}}}' is not a dotted path such as ${{issue.number}}")
        paths.append(path)
    return paths


def render(template: str, payload: Any, *, escape: Callable[[str], str] | None = None) -> str:
    """``template`` with every ``${path}`` replaced by the payload's value there (``escape``, if
    given, is applied to each inserted value). MissingPath names the first path that is absent."""
    placeholders(template)

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        text = text_of(lookup(payload, match.group(1)))
        return escape(text) if escape is not None else text

    return _PLACEHOLDER.sub(substitute, template)


# -- signatures ---------------------------------------------------------------------------------


def sign(secret: bytes, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value GitHub sends for ``body``: ``sha256=<hex>``."""
    return SIGNATURE_PREFIX + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secret: bytes, body: bytes, header: str | None) -> bool:
    """Whether ``header`` is the signature of ``body`` (constant-time compare)."""
    if not header or not header.startswith(SIGNATURE_PREFIX):
        return False
    offered = header[len(SIGNATURE_PREFIX) :].strip().lower().encode("utf-8", "replace")
    return hmac.compare_digest(sign(secret, body)[len(SIGNATURE_PREFIX) :].encode(), offered)


# Standard Webhooks (https://www.standardwebhooks.com): ``webhook-signature`` is a space-separated
# list of ``v1,<base64 HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}">``; a ``whsec_``
# secret is base64 after the prefix. The timestamp must be within the hook's tolerance of now.
STANDARD_ID = "webhook-id"
STANDARD_TIMESTAMP = "webhook-timestamp"
STANDARD_SIGNATURE = "webhook-signature"
_STANDARD_PREFIX = b"whsec_"


class SignatureError(ValueError):
    """Why a Standard Webhooks signature was refused (the message is the client's hint)."""


def standard_key(secret: bytes) -> bytes:
    if secret.startswith(_STANDARD_PREFIX):
        try:
            return base64.b64decode(secret[len(_STANDARD_PREFIX) :], validate=True)
        except binascii.Error:
            return secret
    return secret


def sign_standard(secret: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for a delivery: ``v1,<base64>``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(standard_key(secret), signed, hashlib.sha256).digest()).decode()


def verify_standard(
    secret: bytes,
    body: bytes,
    *,
    msg_id: str | None,
    timestamp: str | None,
    header: str,
    now: float,
    tolerance_s: float,
) -> str:
    """The matching ``v1,<base64>`` signature; SignatureError when none matches or the timestamp
    is missing or outside ``tolerance_s`` of ``now`` (unix seconds)."""
    if not msg_id or not timestamp:
        raise SignatureError(f"{STANDARD_SIGNATURE} needs {STANDARD_ID} and {STANDARD_TIMESTAMP} headers too")
    try:
        when = int(timestamp.strip())
    except ValueError:
        raise SignatureError(f"{STANDARD_TIMESTAMP} must be unix seconds, not {timestamp[:40]!r}") from None
    if abs(now - when) > tolerance_s:
        raise SignatureError(
            f"{STANDARD_TIMESTAMP} {when} is {int(now - when)} s from the gateway's clock; the tolerance is"
            f" {tolerance_s:g} s (hooks.<name>.tolerance_s): sign each delivery when it is sent"
        )
    expected = sign_standard(secret, msg_id, when, body).encode()
    for offered in header.split():
        if hmac.compare_digest(offered.encode("utf-8", "replace"), expected):
            return offered
    raise SignatureError(
        f"no {STANDARD_SIGNATURE} entry matches: send 'v1,' and the base64 HMAC-SHA256 of"
        f" '{{{STANDARD_ID}}}.{{{STANDARD_TIMESTAMP}}}.{{body}}' keyed with the hook's secret"
    )


# -- payloads and plans -------------------------------------------------------------------------


@dataclass(frozen=True)
class HookPlan:
    """What one delivery becomes: a message on a key, with the run's task key if it starts one."""

    key: SessionKey
    message: str
    task_key: TaskKey


TEMPLATE_FIELDS = ("key_template", "message_template", "task_type", "task_identifier", "repository", "user")


def check_mapping(name: str, mapping: HookMapping) -> None:
    """TemplateError naming ``hooks.<name>.<field>`` for a template with wrong syntax."""
    for field in TEMPLATE_FIELDS:
        template = getattr(mapping, field)
        if template is None:
            continue
        try:
            placeholders(template)
        except TemplateError as exc:
            raise TemplateError(f"hooks.{name}.{field}: {exc}") from None


def plan(
    name: str,
    mapping: HookMapping,
    payload: Any,
    *,
    agents: Collection[str],
    new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> HookPlan:
    """Apply hook ``name``'s mapping to a payload. A missing path is a 400 ``invalid_field`` naming
    it; a key that does not parse is a 400 ``invalid_key``. Values inserted into the key template
    are ids: a ``:`` in one is written ``%3A``."""

    def field(field: str, *, escape: Callable[[str], str] | None = None) -> str | None:
        template = getattr(mapping, field)
        if template is None:
            return None
        try:
            return render(template, payload, escape=escape)
        except MissingPath as exc:
            raise BadRequest(
                f"hooks.{name}.{field} needs '{exc.path}' but {exc.reason}; send a payload that has it"
                f" or change the template",
                field=exc.path,
            ) from None

    raw_key = field("key_template", escape=escape_segment)
    key = parse_key(raw_key if raw_key is not None else hook_key(new_id()), agents=agents)
    if key.family != "hook":
        raise InvalidKey(
            f"hooks.{name}.key_template made {key.raw!r}; a webhook key must start with 'hook:'"
        )
    message = field("message_template")
    if message is None:
        message = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    task_identifier = field("task_identifier")
    task_key = TaskKey(
        task_type=field("task_type") or "hook",
        task_identifier=key.raw if mapping.task_identifier is None else task_identifier or None,
        repository=field("repository") or None,
        user=field("user") or None,
    )
    return HookPlan(key=dataclasses.replace(key, agent_id=mapping.agent), message=message, task_key=task_key)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "a string"
