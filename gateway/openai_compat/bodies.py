"""Request bodies of the OpenAI-compatible routes, and their messages as a conversation.

Known fields are validated; the sampling options OpenAI clients send (``temperature``,
``top_p``, ``max_tokens``, ...) are accepted and not used: the agent's model settings decide.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from config.errors import BadRequest
from gateway.openai_compat.history import ChatMessage

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_INSTRUCTIONS = 100_000


_NULLABLE_BOOL = WithJsonSchema({"anyOf": [{"type": "boolean"}, {"type": "null"}]})
# a boolean that takes null for its default, as OpenAI's API does (the SDKs send an explicit None)
NullIsFalse = Annotated[bool, BeforeValidator(lambda v: False if v is None else v), _NULLABLE_BOOL]
NullIsTrue = Annotated[bool, BeforeValidator(lambda v: True if v is None else v), _NULLABLE_BOOL]


class Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(Lenient):
    include_usage: NullIsFalse = False


class ChatCompletionBody(Lenient):
    """``POST /v1/chat/completions``: OpenAI's body; unknown fields are accepted and ignored."""

    model: str = Field(min_length=1, max_length=200, description="`neotask/<agent id>` or a bare agent id")
    messages: list[dict[str, Any]] = Field(min_length=1, description="the conversation, resent whole")
    stream: NullIsFalse = Field(False, description="null: false, as OpenAI takes it")
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, min_length=1, max_length=200, description="per-user session")
    tools: list[dict[str, Any]] | None = Field(None, description="the client's function tools")
    tool_choice: str | dict[str, Any] | None = None
    n: int | None = Field(None, ge=1, le=1, description="only 1 is supported")


class ResponsesBody(Lenient):
    """``POST /v1/responses``: OpenAI's Responses body; unknown fields are accepted and ignored."""

    model: str = Field(min_length=1, max_length=200, description="`neotask/<agent id>` or a bare agent id")
    input: str | list[dict[str, Any]] = Field(description="text, or input items (messages, function_call_output)")
    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS)
    previous_response_id: str | None = Field(None, min_length=1, max_length=200)
    store: NullIsTrue = Field(True, description="null: true, as OpenAI takes it")
    stream: NullIsFalse = Field(False, description="null: false, as OpenAI takes it")
    user: str | None = Field(None, min_length=1, max_length=200, description="per-user session")
    tools: list[dict[str, Any]] | None = Field(None, description="the client's function tools")
    tool_choice: str | dict[str, Any] | None = None


def text_of(content: Any, where: str) -> str:
    """A message's text: a string, or text parts (``text``, ``input_text``, ``output_text``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("text", "input_text", "output_text") or not isinstance(part.get("text"), str):
                raise BadRequest(
                    f"{where}[{i}] must be a text part ({{'type': 'text', 'text': ...}}); images, audio and files"
                    " are not supported",
                    field=f"{where}[{i}]",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"{where} must be a string or a list of text parts", field=where)


def _tool_calls(value: Any, where: str) -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadRequest(f"{where} must be a list", field=where)
    calls = []
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(call.get("id"), str):
            raise BadRequest(f"{where}[{i}] must be {{id, type: function, function: {{name, arguments}}}}", field=where)
        name, arguments = function.get("name"), function.get("arguments", "")
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise BadRequest(f"{where}[{i}].function needs a string name and arguments", field=where)
        calls.append({"id": call["id"], "type": "function", "function": {"name": name, "arguments": arguments}})
    return tuple(calls)


def chat_conversation(messages: list[dict[str, Any]]) -> tuple[str | None, list[ChatMessage]]:
    """(instructions from the system and developer messages, the conversation). The conversation
    must end with a user or tool message: that is what the call asks the agent to answer."""
    instructions: list[str] = []
    conversation: list[ChatMessage] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        content = message.get("content")
        if not isinstance(content, str):  # text parts (or an error); a plain string is the usual case
            content = text_of(content, f"messages[{i}].content")
        if role == "user":
            name = message.get("name")
            conversation.append(ChatMessage("user", content, name=name if isinstance(name, str) else None))
        elif role == "assistant":
            calls = message.get("tool_calls")
            calls = _tool_calls(calls, f"messages[{i}].tool_calls") if calls is not None else ()
            conversation.append(ChatMessage("assistant", content, tool_calls=calls))
        elif role in ("system", "developer"):
            instructions.append(content)
        elif role == "tool":
            call_id = _call_id(message, "tool_call_id", f"messages[{i}]", " (role tool)")
            conversation.append(ChatMessage("tool", content, tool_call_id=call_id))
        else:
            raise BadRequest(
                f"messages[{i}].role must be system, developer, user, assistant or tool, not {role!r}",
                field=f"messages[{i}].role",
            )
    return _checked(instructions, conversation, "messages")


def _call_id(item: dict[str, Any], key: str, where: str, kind: str = "") -> str:
    """The id of the call a tool result (a chat `tool` message or a Responses item) answers."""
    call_id = item.get(key)
    if not isinstance(call_id, str) or not call_id:
        raise BadRequest(f"{where}{kind} needs {key!r}", field=f"{where}.{key}")
    return call_id


def _checked(
    instructions: list[str], conversation: list[ChatMessage], where: str
) -> tuple[str | None, list[ChatMessage]]:
    if not conversation or conversation[-1].role not in ("user", "tool"):
        raise BadRequest(f"{where} must end with a user message (or tool results)", field=where)
    if conversation[-1].role == "user" and not conversation[-1].content.strip():
        raise BadRequest(f"{where}: the last user message is empty", field=where)
    text = "\n\n".join(t for t in instructions if t.strip())
    if len(text) > MAX_INSTRUCTIONS:
        raise BadRequest(f"system messages are longer than {MAX_INSTRUCTIONS} characters", field=where)
    if any(m.role == "assistant" for m in conversation):  # a whole history: its tool results answer its calls
        called = {c["id"] for m in conversation for c in m.tool_calls}
        for m in conversation:
            if m.role == "tool" and m.tool_call_id not in called:
                message = f"{where}: a tool result answers {m.tool_call_id!r}, which no assistant message called"
                raise BadRequest(message, field=where)
    return text or None, conversation


def responses_conversation(body: ResponsesBody) -> tuple[str | None, list[ChatMessage]]:
    """Input items as a conversation (all of them are new: the session holds the rest)."""
    instructions = [body.instructions] if body.instructions else []
    if isinstance(body.input, str):
        return _checked(instructions, [ChatMessage("user", body.input)], "input")
    conversation: list[ChatMessage] = []
    for i, item in enumerate(body.input):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            content = text_of(item.get("content"), f"{where}.content")
            if role in ("system", "developer"):
                instructions.append(content)
            elif role in ("user", "assistant"):
                conversation.append(ChatMessage(role, content))
            else:
                raise BadRequest(f"{where}.role must be system, developer, user or assistant", field=f"{where}.role")
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
            if not all(isinstance(v, str) for v in (call_id, name, arguments)):
                raise BadRequest(f"{where} needs string call_id, name and arguments", field=where)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            conversation.append(ChatMessage("assistant", "", tool_calls=(call,)))
        elif kind == "function_call_output":
            call_id = _call_id(item, "call_id", where)
            output = text_of(item.get("output"), f"{where}.output")
            conversation.append(ChatMessage("tool", output, tool_call_id=call_id))
        else:
            raise BadRequest(
                f"{where}.type {kind!r} is not supported (message, function_call, function_call_output)",
                field=f"{where}.type",
            )
    return _checked(instructions, conversation, "input")


def chat_tools(
    tools: list[dict[str, Any]] | None, reserved: set[str], where: str = "tools"
) -> tuple[dict[str, Any], ...]:
    """The client's function tools in chat-completions form; Responses' flat form is accepted too."""
    out = []
    for i, tool in enumerate(tools or ()):
        if tool.get("type") != "function":
            raise BadRequest(f"{where}[{i}]: only function tools are supported", field=f"{where}[{i}].type")
        function: dict[str, Any] = tool["function"] if isinstance(tool.get("function"), dict) else tool
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise BadRequest(f"{where}[{i}]: a function name is 1-64 of A-Z a-z 0-9 _ -", field=f"{where}[{i}].name")
        if name in reserved:
            raise BadRequest(f"{where}[{i}]: {name!r} is one of the agent's own tools; rename it", field=where)
        schema: dict[str, Any] = {"name": name, "parameters": function.get("parameters") or {"type": "object"}}
        if isinstance(function.get("description"), str):
            schema["description"] = function["description"]
        out.append({"type": "function", "function": schema})
    return tuple(out)


def tool_choice(value: str | dict[str, Any] | None, names: set[str]) -> str | dict[str, Any] | None:
    """OpenAI's ``tool_choice``; Responses' flat ``{type: function, name}`` becomes the chat form."""
    if value is None or value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        function: dict[str, Any] = value["function"] if isinstance(value.get("function"), dict) else value
        name = function.get("name")
        if name in names:
            return {"type": "function", "function": {"name": name}}
    raise BadRequest("tool_choice must be auto, none, required or one of the given functions", field="tool_choice")


Finish = Literal["stop", "tool_calls"]
