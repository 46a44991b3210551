"""The PostgreSQL backend of the session store (``storage.backend: postgres``).

``store.PgStore`` is composed of parts, each a class of its own over one shared ``state.PgState``
(the pool, the in-memory view: entries, active runs, events): ``batching`` (the append queue, one
statement per batch), ``appends`` (core: messages, records, usage, the context rewrite), ``reads``
(core reads), ``records`` (idempotency, delivery and OpenAI-compatible records), ``usage``,
``lifecycle`` (core: start, pause, resume, complete, delete, discard), ``maintenance`` (purge,
cleanup, the doctor), ``export`` and ``shared`` (keys leased across processes). Beside them:
``schema`` (versioned migrations), ``faults`` (a lost or refusing server as the typed storage
errors), ``history`` (the history index), ``leader`` (leadership), ``bulk`` (the storage copy).
"""
