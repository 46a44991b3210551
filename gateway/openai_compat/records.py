"""tasks.db records of the OpenAI-compatible routes (migration 5): the conversation each key's
client holds, and response ids. The store reads and writes them; this keeps the conversations
this process has seen in memory (write-through: it is their only writer)."""

from __future__ import annotations

from sessions.protocol import ConversationStore
from sessions.records import CompatConversation, ResponseRef

__all__ = ["CompatRecords", "ResponseRef"]


class CompatRecords:
    def __init__(self, store: ConversationStore) -> None:
        self.store = store
        self._known: dict[str, CompatConversation] = {}

    async def conversation(self, key: str) -> CompatConversation | None:
        if key in self._known:
            return self._known[key]
        record = await self.store.compat_conversation(key)
        if record is not None:
            self._known[key] = record
        return record

    async def save_conversation(self, key: str, record: CompatConversation) -> None:
        await self.store.save_compat_conversation(key, record)
        self._known[key] = record

    def forget(self, key: str) -> None:
        """Drop the key's record from memory (its rows were purged)."""
        self._known.pop(key, None)

    async def response(self, response_id: str) -> ResponseRef | None:
        return await self.store.compat_response(response_id)

    async def latest_response(self, key: str) -> str | None:
        return await self.store.latest_compat_response(key)

    async def save_response(self, ref: ResponseRef) -> None:
        await self.store.save_compat_response(ref)
