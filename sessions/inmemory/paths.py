"""``RunState.dir`` of an in-memory run: a path under a folder that does not exist and is never
created (nothing of the engine may read or write a run's folder; a test would see it fail)."""

from pathlib import Path

NOWHERE = Path("/nonexistent/neotask-memory-store")
