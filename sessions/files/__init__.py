"""The run-folder backend of the session store: JSONL files, tasks.db, sessions.json."""
