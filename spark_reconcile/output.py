"""Where a run's files go, and how a rerun replaces a date's results atomically.

Owns: the layout ``{root}/runs/{run_id}/`` (one folder per run) and ``{root}/date=YYYY-MM-DD``, a
symbolic link to the date's current run. A run writes into a hidden staging folder; publishing renames
it into place and swaps the link with ``os.replace`` (atomic on POSIX), so a reader sees the old
results or the new ones, never a mix, and a failed run leaves nothing behind (``discard``).

Must never: delete a previous run before the new one is published and committed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shutil
from pathlib import Path


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunOutput:
    root: Path
    business_date: dt.date
    run_id: str

    @property
    def staging(self) -> Path:
        return self.root / "runs" / f".{self.run_id}.staging"

    @property
    def final(self) -> Path:
        return self.root / "runs" / self.run_id

    @property
    def link(self) -> Path:
        return self.root / f"date={self.business_date.isoformat()}"

    def prepare(self) -> Path:
        self.staging.mkdir(parents=True, exist_ok=False)
        return self.staging

    def publish(self) -> Path | None:
        """Move the staged run into place and point the date at it; return the replaced run, if any."""
        previous = self.link.resolve() if self.link.is_symlink() else None
        self.staging.rename(self.final)
        temporary = self.root / f".date={self.business_date.isoformat()}.{self.run_id}"
        temporary.symlink_to(Path("runs") / self.run_id, target_is_directory=True)
        os.replace(temporary, self.link)
        return previous

    def restore(self, previous: Path | None) -> None:
        """Undo ``publish`` when the summary commit fails after the swap."""
        if previous is not None:
            temporary = self.root / f".date={self.business_date.isoformat()}.{self.run_id}.restore"
            temporary.symlink_to(Path("runs") / previous.name, target_is_directory=True)
            os.replace(temporary, self.link)
        else:
            self.link.unlink(missing_ok=True)
        shutil.rmtree(self.final, ignore_errors=True)

    def retire(self, previous: Path | None) -> None:
        """Delete the replaced run once the new one is committed."""
        if previous is not None and previous != self.final.resolve():
            shutil.rmtree(previous, ignore_errors=True)

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
