"""The official ``openai`` package as a test client: build its response models once, at import.

The SDK builds the pydantic models of its answers and stream events on first use, which takes a
second or more on this machine; done inside a test, that first use trips the fixture that fails
tests blocking their event loop. Test modules call ``warm_openai_sdk()`` at import instead.
"""

from __future__ import annotations

import functools

from openai._models import construct_type
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

_OUTPUT = [
    {"type": "function_call", "call_id": "c", "name": "n", "arguments": "{}"},
    {"type": "message", "content": [{"type": "output_text", "text": "t"}]},
]


@functools.cache
def warm_openai_sdk() -> None:
    for model in (ChatCompletion, ChatCompletionChunk, Response):
        construct_type(type_=model, value={"id": "x", "output": _OUTPUT, "choices": []})
    for event in ("response.created", "response.output_text.delta", "response.completed"):
        construct_type(type_=ResponseStreamEvent, value={"type": event, "sequence_number": 0, "response": {}})
