"""The PostgreSQL backend of the session store (``storage.backend: postgres``).

Modules by capability, as the store port splits it: ``schema`` (versioned migrations), ``faults``
(a lost or refusing server as the typed storage errors), ``base`` (the in-memory view: entries,
active runs, events), ``appends`` (core: the per-run append queue, one statement per batch, the
context rewrite), ``lifecycle`` (core: start, pause, resume, complete, delete, discard), ``reads``
(core reads), ``records`` (idempotency, delivery and OpenAI-compatible records) and ``store``
(open, recovery of the active runs, close).
"""
