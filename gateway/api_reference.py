"""The HTTP API reference of the docs site, generated from the OpenAPI document the gateway serves
at ``GET /openapi.json`` (``gateway/openapi.py``), built in-process from a gateway app's router:
every route with its parameters, body, answers and error codes, and every schema."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

METHODS = ("get", "head", "post", "put", "patch", "delete", "options", "trace")
NOT_OPERATIONS = frozenset({"summary", "description", "parameters", "servers", "$ref"})
LIMITS = (("minLength", "length ≥"), ("maxLength", "length ≤"), ("minimum", "≥"), ("maximum", "≤"),
          ("exclusiveMinimum", ">"), ("minItems", "items ≥"), ("maxItems", "items ≤"))  # fmt: skip


def gateway_document() -> dict[str, Any]:
    """The document a gateway with the default configuration serves (its routes do not depend on
    the configuration: a disabled feature's routes answer 404 but are registered)."""
    from config.loader import load_config
    from gateway import openapi
    from gateway.app import create_app

    app = create_app(load_config(env={}, home="/nonexistent-neotask-home"))
    return openapi.build(list(app.router.routes()))


def cell(text: str) -> str:
    """Table cell text: one line, ``|`` escaped and ``<...>`` shown outside code spans."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def prose(text: str) -> str:
    """A description as a paragraph: ``<...>`` shown outside code spans."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def schema_text(schema: Mapping[str, Any]) -> str:
    """A schema in a few words: ``string (length ≤ 200) or null``, ``array of [Run](#run)``."""
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    for combined in ("anyOf", "oneOf"):
        if combined in schema:
            return " or ".join(schema_text(s) for s in schema[combined])
    if "allOf" in schema:
        return " and ".join(schema_text(s) for s in schema["allOf"])
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kinds = schema.get("type", "any")
    kind = " or ".join(kinds) if isinstance(kinds, list) else str(kinds)
    if kind == "array" and "items" in schema:
        kind = f"array of {schema_text(schema['items'])}"
    limits = [f"{word} {schema[key]}" for key, word in LIMITS if key in schema]
    return f"{kind} ({', '.join(limits)})" if limits else kind


def _parameters(op: Mapping[str, Any]) -> list[str]:
    params = op.get("parameters") or []
    if not params:
        return []
    rows = ["| parameter | in | type | required | what it is |", "|---|---|---|---|---|"]
    for p in params:
        rows.append(
            f"| `{p['name']}` | {p['in']} | {schema_text(p.get('schema', {}))} | "
            f"{'yes' if p.get('required') else ''} | {cell(p.get('description', ''))} |"
        )
    return ["", *rows]


def _body(op: Mapping[str, Any]) -> list[str]:
    body = op.get("requestBody")
    if not body:
        return []
    kinds = ", ".join(f"`{ctype}` {schema_text(c.get('schema', {}))}" for ctype, c in body["content"].items())
    return ["", f"**Body** ({'required' if body.get('required') else 'optional'}): {kinds}"]


def _responses(op: Mapping[str, Any]) -> list[str]:
    """Each status: the answer's schema, or for an error the codes it carries and what each means."""
    rows = ["", "| status | answer |", "|---|---|"]
    for status, answer in op.get("responses", {}).items():
        shapes = [schema_text(c["schema"]) for c in answer.get("content", {}).values() if "schema" in c]
        error = "x-error-codes" in answer or not shapes
        rows.append(f"| {status} | {cell(answer.get('description', '')) if error else ' or '.join(shapes)} |")
    return rows


def _operation(method: str, path: str, op: Mapping[str, Any]) -> list[str]:
    out = [f"### {method.upper()} {path}", ""]
    if op.get("summary"):
        out.append(f"**{prose(op['summary'])}**" + ("" if op.get("security") else " (no token needed)"))
    if op.get("description"):
        out += ["", prose(op["description"])]
    return [*out, *_parameters(op), *_body(op), *_responses(op), ""]


def _schema(name: str, schema: Mapping[str, Any]) -> list[str]:
    out = [f"### {name}", ""]
    if schema.get("description"):
        out += [prose(schema["description"]), ""]
    properties = schema.get("properties")
    if not properties:
        return [*out, f"Type: {schema_text(schema)}", ""]
    required = set(schema.get("required", []))
    out += ["| field | type | required | default | what it is |", "|---|---|---|---|---|"]
    for field, spec in properties.items():
        default = f"`{spec['default']}`" if "default" in spec and spec["default"] is not None else ""
        out.append(
            f"| `{field}` | {schema_text(spec)} | {'yes' if field in required else ''} | {default} "
            f"| {cell(spec.get('description', ''))} |"
        )
    return [*out, ""]


def api_markdown(document: Mapping[str, Any]) -> str:
    """The reference page: a section per operation of every path (``ValueError`` for a key of a path
    that is neither an operation the page shows nor a known non-operation field)."""
    info = document["info"]
    out = [
        "# HTTP API reference",
        "",
        f"Generated each time the site is built from the OpenAPI {document['openapi']} document the gateway",
        "serves at `GET /openapi.json` (the same document, built from the gateway's own router and",
        "handlers). An overview, with the rules every route shares: [The HTTP API](../api.md); every",
        "error code: [Error codes](../errors.md).",
        "",
        prose(info.get("description", "")),
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, Mapping[str, Any]]]] = {}
    unknown = []
    for path, item in document["paths"].items():
        for key, op in item.items():
            if key in METHODS:
                by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((key, path, op))
            elif key not in NOT_OPERATIONS and not key.startswith("x-"):
                unknown.append(f"{key} {path}")
    if unknown:
        raise ValueError(f"operations the reference cannot show: {sorted(unknown)}")
    for tag in sorted(by_tag):
        out += [f"## Routes: {tag}", ""]
        for method, path, op in by_tag[tag]:
            out += _operation(method, path, op)
    out += ["## Schemas", ""]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        out += _schema(name, schema)
    return "\n".join(out).rstrip("\n") + "\n"
