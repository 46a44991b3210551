"""OpenAI's answer shapes: chat completions and their chunks, Responses objects and their
``response.*`` stream events, and usage, built from what the agent answered."""

from __future__ import annotations

import json
import uuid
from typing import Any

from gateway.openai_compat.service import Answer


def sse_data(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


# -- chat completions ---------------------------------------------------------------------------


def chat_usage(usage: dict[str, int]) -> dict[str, Any]:
    prompt, completion = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": usage.get("cache_read_tokens", 0)},
    }


def completion(ident: str, created: int, model: str, answer: Answer) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None}
    if answer.tool_calls:
        message["tool_calls"] = answer.tool_calls
        message["content"] = answer.content or None
    return {
        "id": ident,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": answer.finish_reason}],
        "usage": chat_usage(answer.outcome.usage),
    }


def chunk(
    ident: str, created: int, model: str, delta: dict[str, Any], finish: str | None = None, *, usage: bool = False
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if usage:
        body["usage"] = None
    return body


def usage_chunk(ident: str, created: int, model: str, answer: Answer) -> dict[str, Any]:
    return {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [],
        "usage": chat_usage(answer.outcome.usage),
    }


def tool_call_deltas(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"index": i, **call} for i, call in enumerate(calls)]


# -- responses ----------------------------------------------------------------------------------


def response_usage(usage: dict[str, int]) -> dict[str, Any]:
    prompt, output = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": usage.get("cache_read_tokens", 0)},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [output_text(text)] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_item(call: dict[str, Any], *, arguments: str | None = None, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_" + uuid.uuid5(uuid.NAMESPACE_OID, call["id"]).hex,
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"] if arguments is None else arguments,
        "status": status,
    }


def output_items(answer: Answer, message_id: str) -> list[dict[str, Any]]:
    items = [message_item(message_id, answer.content)] if answer.content or not answer.tool_calls else []
    return items + [function_item(c) for c in answer.tool_calls]


def response(
    response_id: str,
    created: int,
    model: str,
    request: dict[str, Any],
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, int] | None,
) -> dict[str, Any]:
    """A Responses API object. ``request``: instructions, previous_response_id, store, user, tools,
    tool_choice, metadata as the call sent them."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": request.get("store", True),
        "temperature": None,
        "text": {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": request.get("tools") or [],
        "top_p": None,
        "truncation": "disabled",
        "usage": response_usage(usage) if usage is not None else None,
        "user": request.get("user"),
        "metadata": request.get("metadata") or {},
    }


class ResponseEvents:
    """The ``response.*`` events of one streamed response, numbered in order."""

    def __init__(self, response_id: str, created: int, model: str, request: dict[str, Any]) -> None:
        self.response_id, self.created, self.model, self.request = response_id, created, model, request
        self.sequence = 0
        self.message_id = "msg_" + uuid.uuid4().hex
        self.message_open = False
        self.streamed_text = ""

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse_data(data, event=kind)

    def shell(self, status: str) -> dict[str, Any]:
        return response(self.response_id, self.created, self.model, self.request, status=status, output=[], usage=None)

    def start(self) -> list[bytes]:
        return [
            self.event("response.created", response=self.shell("in_progress")),
            self.event("response.in_progress", response=self.shell("in_progress")),
        ]

    def open_message(self) -> list[bytes]:
        if self.message_open:
            return []
        self.message_open = True
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        return [
            self.event(
                "response.output_item.added", output_index=0, item=message_item(self.message_id, "", "in_progress")
            ),
            self.event("response.content_part.added", **where, part=output_text("")),
        ]

    def delta(self, text: str) -> list[bytes]:
        out = self.open_message()
        self.streamed_text += text
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        out.append(self.event("response.output_text.delta", **where, delta=text, logprobs=[]))
        return out

    def finish(self, answer: Answer) -> list[bytes]:
        out: list[bytes] = []
        if answer.content and not self.streamed_text:  # a command's answer, or nothing was streamed
            out += self.delta(answer.content)
        index = 0
        if self.message_open or not answer.tool_calls:
            out += self.open_message()
            where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
            out += [
                self.event("response.output_text.done", **where, text=answer.content, logprobs=[]),
                self.event("response.content_part.done", **where, part=output_text(answer.content)),
                self.event(
                    "response.output_item.done", output_index=0, item=message_item(self.message_id, answer.content)
                ),
            ]
            index = 1
        output = [message_item(self.message_id, answer.content)] if index else []
        for offset, call in enumerate(answer.tool_calls):
            item = function_item(call)
            at = index + offset
            opened = function_item(call, arguments="", status="in_progress")
            where = {"item_id": item["id"], "output_index": at}
            out += [
                self.event("response.output_item.added", output_index=at, item=opened),
                self.event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
                self.event("response.function_call_arguments.done", **where, arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=at, item=item),
            ]
            output.append(item)
        final = response(
            self.response_id,
            self.created,
            self.model,
            self.request,
            status="completed",
            output=output,
            usage=answer.outcome.usage,
        )
        out.append(self.event("response.completed", response=final))
        return out

    def failed(self, error: dict[str, Any]) -> bytes:
        shell = self.shell("failed")
        shell["error"] = {"code": error.get("code"), "message": error.get("message")}
        return self.event("response.failed", response=shell)
