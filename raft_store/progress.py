"""What the leader knows about each follower's log, and how fast it may send to it.

States follow etcd's tracker: PROBE (one append in flight until we learn where the follower's
log matches), REPLICATE (pipelined appends, at most `inflight_max` unacknowledged), SNAPSHOT
(a snapshot is on its way; appends wait).

    # Invariant: match < next
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


@dataclass(slots=True)
class Progress:
    match: int
    next: int
    inflight_max: int
    is_learner: bool = False
    state: ProgressState = ProgressState.PROBE
    probe_sent: bool = False
    pending_snapshot: int = 0
    recent_active: bool = False
    snapshot_ticks: int = 0
    quiet_ticks: int = 0
    """The leader's ticks since it last sent this follower an append or a heartbeat: a heartbeat
    is due once it reaches `heartbeat_ticks` (replication.py, `Replication.tick`)."""
    on_beat: bool = False
    """The last thing the leader sent it was a heartbeat, not an append: it is on the heartbeat
    beat, and its heartbeat may go a little early to keep in step with the others'."""
    inflights: deque[int] = field(default_factory=deque)

    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return len(self.inflights) >= self.inflight_max
        return True

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self._reset(ProgressState.PROBE)

    def become_replicate(self) -> None:
        self.next = self.match + 1
        self._reset(ProgressState.REPLICATE)

    def become_snapshot(self, index: int) -> None:
        self._reset(ProgressState.SNAPSHOT)
        self.pending_snapshot = index
        self.snapshot_ticks = 0

    def _reset(self, state: ProgressState) -> None:
        self.state = state
        self.probe_sent = False
        self.pending_snapshot = 0
        self.inflights.clear()

    def sent_entries(self, last: int) -> None:
        """Account for an append carrying entries up to `last`."""
        if self.state is ProgressState.REPLICATE:
            self.next = last + 1
            self.inflights.append(last)
        elif self.state is ProgressState.PROBE:
            self.probe_sent = True

    def maybe_update(self, index: int) -> bool:
        """A successful append response: the follower matches up to `index`."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        while self.inflights and self.inflights[0] <= index:
            self.inflights.popleft()
        return updated

    def maybe_decrease(self, rejected: int, hint: int) -> bool:
        """A rejected append for prev index `rejected`; `hint` is where the follower suggests to
        continue. Stale rejections (for an index we have already moved past) are ignored."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, hint + 1), self.match + 1)
        self.probe_sent = False
        return True
