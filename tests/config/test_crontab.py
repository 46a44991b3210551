"""The crontab grammar ``config/`` checks schedules with (no scheduler imported)."""

from __future__ import annotations

import pytest

from config.crontab import check_schedule


@pytest.mark.parametrize(
    "schedule",
    ["0 3 * * *", "*/15 * * * *", "0 9 * * 1-5", "0 9 * * mon-fri", "0 9 * * 7", "0 0 1,15 jan-jun *", "5 4 * * sun"],
)
def test_standard_schedules_pass(schedule: str) -> None:
    check_schedule(schedule)


@pytest.mark.parametrize(
    ("schedule", "names"),
    [
        ("0 9 * *", "5 fields"),
        ("60 * * * *", "minute"),
        ("0 24 * * *", "hour"),
        ("0 0 0 * *", "day of month"),
        ("0 0 * 13 *", "month"),
        ("0 9 * * 8", "day of week"),
        ("0 9 * * fri-mon", "range"),
        ("0 9 * * 1/0", "step"),
        ("0 9 * * funday", "day of week"),
        ("0 9 L * *", "day of month"),
    ],
)
def test_bad_schedules_name_the_field(schedule: str, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        check_schedule(schedule)
