"""The in-memory backend of the session store: the capabilities of ``sessions.protocol`` but
``Backup`` (the base and record capabilities, usage, the history index, maintenance) kept in
process memory.

It proves the Protocol is a real port (a second backend passes the conformance suite) and lets
the engine's fast tests run without files. What it keeps lives as long as its ``MemoryData``:
a reopen on the same data (a "restart" in the same process) finds everything acknowledged."""

from sessions.inmemory.data import MemoryData as MemoryData
from sessions.inmemory.store import MemoryStore as MemoryStore
