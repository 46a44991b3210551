"""``backup.keep``: the newest backups kept, newest by their second and then their suffix as a
number, and never the backup just written."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from backups import retention


def test_twelve_backups_of_one_second_keep_the_newest_and_the_one_just_written(tmp_path: Path) -> None:
    now = datetime(2026, 12, 1, 23, 50, tzinfo=UTC)
    retention.backup_dir(tmp_path).mkdir()
    written = []
    for _ in range(12):  # a second backup within the same second gets -1, -2, ... -11
        path = retention.default_path(tmp_path, now)
        path.write_bytes(b"x")
        written.append(path.name)
    assert written[-1] == "neotask-20261201T235000Z-11.tar.gz"
    gone = retention.prune(tmp_path, 7, spare=written[-1])
    left = [b["name"] for b in retention.list_backups(tmp_path)]
    assert left == list(reversed(written[5:]))  # -11 (newest) first, -10 before -9: numbers, not text
    assert sorted(gone) == sorted(written[:5])


def test_the_backup_just_written_survives_a_clock_set_back(tmp_path: Path) -> None:
    retention.backup_dir(tmp_path).mkdir()
    for hour in (20, 21, 22):
        retention.default_path(tmp_path, datetime(2026, 12, 1, hour, tzinfo=UTC)).write_bytes(b"x")
    behind = retention.default_path(tmp_path, datetime(2026, 12, 1, 19, tzinfo=UTC))  # the clock went back
    behind.write_bytes(b"x")
    retention.prune(tmp_path, 2, spare=behind.name)
    assert behind.exists()
