"""A doctor's finding as the backends without files report it (PostgreSQL, memory; the files
backend's doctor has its own ``Finding``, whose ``as_dict`` gives the same shape), written once."""

from __future__ import annotations

from sessions.records import StoredRecord


def finding(
    check: str, severity: str, detail: str, fix: str | None, *, run_id: str | None = None, key: str | None = None,
    fixed: bool = False,
) -> StoredRecord:  # fmt: skip
    """``{"check", "severity", "detail", "fix", ["run_id",] ["key",] "fixed", "fixable"}``; no ``fix``:
    a person's (``fixable`` False)."""
    body: StoredRecord = {"check": check, "severity": severity, "detail": detail, "fix": fix}
    for name, value in (("run_id", run_id), ("key", key)):
        if value is not None:
            body[name] = value
    return body | {"fixed": fixed, "fixable": fix is not None}
