"""The OpenAI-compatible front door: ``/v1/chat/completions``, ``/v1/models`` and ``/v1/responses``
into durable sessions (docs/openai-compat.md)."""
