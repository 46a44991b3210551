"""Tools offered to the model, and their execution. Every call is recorded in tools.jsonl with its
arguments, result, error and duration."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from config.errors import NeotaskError
from conversations.completions import ToolCall
from sessions.protocol import ConversationStore
from sessions.records import RunState, ToolUse
from sessions.tokens import estimate_text

ToolFn = Callable[[RunState, dict[str, Any]], Awaitable[str]]


def params(required: tuple[str, ...], **properties: dict[str, Any]) -> dict[str, Any]:
    """A tool's ``parameters``: a JSON-schema object of ``properties``, ``required`` of them needed."""
    return {"type": "object", "properties": properties, "required": list(required)}


class ToolError(Exception):
    """A tool refused its arguments; the message goes back to the model."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    run: ToolFn

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


class ToolBox:
    def __init__(self, store: ConversationStore) -> None:
        self.store = store
        self._tools: dict[str, Tool] = {}
        self._schema_tokens: int | None = None
        self.register(
            Tool(
                name="update_plan",
                description="Record the current plan for this task (kept in the session's planning history).",
                parameters=params(
                    ("plan",),
                    plan={"type": "string", "description": "The plan, as text or a checklist."},
                    plan_type={
                        "type": "string",
                        "enum": ["initial", "update", "final"],
                        "description": "initial for the first plan, update for revisions, final when done.",
                    },
                ),
                run=self._update_plan,
            )
        )

    def register(self, tool: Tool) -> None:
        self._tools[tool.name] = tool
        self._schema_tokens = None

    def schema_tokens(self) -> int:
        """The token estimate of every tool schema as the model is sent them (computed once per
        set of tools: it is counted toward the threshold on every turn)."""
        if self._schema_tokens is None:
            self._schema_tokens = estimate_text(json.dumps(self.schemas()))
        return self._schema_tokens

    def has(self, name: str) -> bool:
        return name in self._tools

    def schemas(self, names: set[str] | None = None) -> list[dict[str, Any]]:
        return [t.schema() for t in self._tools.values() if names is None or t.name in names]

    async def execute(self, run: RunState, call: ToolCall, *, extra: dict[str, Any] | None = None) -> str:
        """Run one call and record it; failures become an ``error: ...`` text for the model."""
        started = time.perf_counter()
        arguments: Any = call.arguments
        result: str | None = None
        error: str | None = None
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
            if not isinstance(arguments, dict):
                raise ToolError("arguments must be a JSON object")
            tool = self._tools.get(call.name)
            if tool is None:
                raise ToolError(f"unknown tool {call.name!r}; available: {', '.join(sorted(self._tools))}")
            result = await tool.run(run, arguments)
        except json.JSONDecodeError as exc:
            error = f"arguments are not valid JSON: {exc.msg}"
        except ToolError as exc:
            error = str(exc)
        except NeotaskError as exc:  # e.g. the memory service refusing a path: told to the model
            error = exc.message
        duration_ms = (time.perf_counter() - started) * 1000
        await self.store.record_tool(
            run,
            ToolUse(
                tool_name=call.name,
                arguments=arguments,
                result=result,
                error=error,
                duration_ms=duration_ms,
                extra={"tool_call_id": call.id, **(extra or {})},
            ),
        )
        return f"error: {error}" if error is not None else result or ""

    async def _update_plan(self, run: RunState, arguments: dict[str, Any]) -> str:
        plan = arguments.get("plan")
        if not isinstance(plan, str) or not plan.strip():
            raise ToolError("'plan' must be a non-empty string")
        plan_type = arguments.get("plan_type") or ("initial" if run.next_plan_id == 1 else "update")
        if plan_type not in ("initial", "update", "final"):
            raise ToolError("'plan_type' must be initial, update or final")
        record = await self.store.record_plan(run, plan_type=str(plan_type), plan_content=plan)
        return f"plan recorded (id {record['id']}, {plan_type})"
