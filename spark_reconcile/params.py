"""Parameters of one reconciliation: the business date and the windows around it.

Owns: the arithmetic from a business date to the instants the rules and the readers use. Times are
UTC; the business day is [date 00:00, date+1 00:00). The "as of" instant is the end of the business
day, never the wall clock, so a rerun of an old date computes the same pending-SLA breaks.

Must never: read clocks or the environment.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Final

JDBC_JAR: Final = "/usr/share/java/postgresql.jar"
"""Debian's libpostgresql-jdbc-java, the driver the JDBC source uses: nothing comes from Maven at run time."""

LATE_WINDOW_MAX: Final = dt.timedelta(days=7)
PENDING_SLA_MAX: Final = dt.timedelta(days=30)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileParams:
    """What defines a run's result; everything else (paths, master) is configuration."""

    business_date: dt.date
    late_window: dt.timedelta = dt.timedelta(hours=6)
    pending_sla: dt.timedelta = dt.timedelta(hours=4)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if not dt.timedelta(0) <= self.late_window <= LATE_WINDOW_MAX:
            raise ValueError(f"late window must be within 0..{LATE_WINDOW_MAX}, got {self.late_window}")
        if not dt.timedelta(0) < self.pending_sla <= PENDING_SLA_MAX:
            raise ValueError(f"pending SLA must be within (0, {PENDING_SLA_MAX}], got {self.pending_sla}")

    @property
    def day_start(self) -> dt.datetime:
        return dt.datetime.combine(self.business_date, dt.time(0), tzinfo=dt.UTC)

    @property
    def day_end(self) -> dt.datetime:
        """Exclusive end of the business day; also the "as of" instant of open-request checks."""
        return self.day_start + dt.timedelta(days=1)

    @property
    def read_start(self) -> dt.datetime:
        """Counterpart records up to one late window before the day still match (early payments)."""
        return self.day_start - self.late_window

    @property
    def read_end(self) -> dt.datetime:
        """Records arriving up to one late window after midnight still match the day's records."""
        return self.day_end + self.late_window

    @property
    def sla_deadline(self) -> dt.datetime:
        """Requests created before this instant and still open at day end are past their SLA."""
        return self.day_end - self.pending_sla

    def as_json(self) -> dict[str, str | float]:
        return {
            "business_date": self.business_date.isoformat(),
            "late_window_s": self.late_window.total_seconds(),
            "pending_sla_s": self.pending_sla.total_seconds(),
        }
