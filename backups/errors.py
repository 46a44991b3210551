"""The errors of backups and restores, each with its HTTP status (``config.errors``)."""

from __future__ import annotations

from config.errors import BadRequest, Conflict


class BackupTargetError(BadRequest):
    code = "backup_target_unwritable"
    doc = "the backup file cannot be written there: choose a writable folder (-o / output)"


class BackupInvalid(BadRequest):
    code = "backup_invalid"
    doc = "the file is not a complete neotask backup (corrupt, truncated or not a backup): take a new one"


class HomeNotEmpty(Conflict):
    code = "home_not_empty"
    doc = "a restore goes into a new or empty folder only: choose another --home"
    http = False  # neotask restore works on the files, never through the API


class BackupRunning(Conflict):
    code = "backup_running"
    doc = "a backup is being taken already: wait for it to finish"
