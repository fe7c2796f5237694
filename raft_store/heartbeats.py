"""When a leader heartbeats each follower: once it has sent it nothing for a heartbeat interval.

Heartbeats are not on a fixed beat. A heartbeat goes to a follower once `heartbeat_ticks` ticks
passed without the leader sending it an append or a heartbeat (`Progress.quiet_ticks`, reset by
`Replication.send_append` and here). Under load the appends (every few milliseconds) already do
everything a heartbeat does: an append resets the follower's election timer, carries the commit
index (all of it: the follower commits only what it holds) and, stamped by the runner, the
leader's clock reading; its answer carries the follower's wall clock and counts as contact for
check-quorum, as a heartbeat's does. A follower that gets no append (paused, probing, lagging,
idle) gets heartbeats as before, and their answers re-send what was lost. So no follower goes
longer than `heartbeat_ticks` ticks without a message from its leader, the bound of a fixed beat,
which the log clock's band and the followers' staircase assume (log_clock.py). Under load a set's
heartbeats and their answers, each a turn on both sides, are not sent: with many sets on a
machine that was part of the standing cost each set adds (docs/raft.md, "Heartbeats a leader
skips").

When one follower's heartbeat is due, the others on the heartbeat beat (their last message was a
heartbeat: `Progress.on_beat`) past half the interval get theirs too: followers whose appends
ended on different ticks fall into step, so an idle leader keeps one heartbeat turn per interval,
while a follower fed appends is not heartbeated because another one (down, paused) is.

Reads are not left to the appends: an append's answer carries no read context, so while a read
waits for a quorum's answers every follower hears its context again every interval (a fixed
beat, `_elapsed`), appends or not. Part of the pure core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raft_store.progress import Progress
from raft_store.types import Message, MessageType

if TYPE_CHECKING:
    from raft_store.core import RaftCore


class Heartbeats:
    """The leader's heartbeat schedule: each follower's quiet ticks live in its `Progress`; this
    keeps the fixed beat a waiting read is repeated on."""

    def __init__(self, core: RaftCore) -> None:
        self._core = core
        self._elapsed = 0

    def reset(self) -> None:
        self._elapsed = 0

    def broadcast(self, progress: dict[int, Progress], context: bytes) -> None:
        """Every follower hears from the leader now: a read's round, which must not wait for a
        heartbeat due, or a waiting read's context repeated."""
        me = self._core.id
        for node in sorted(progress):
            if node != me:
                self._send(node, progress[node], context)

    def _send(self, node: int, pr: Progress, context: bytes) -> None:
        core = self._core
        core.send_early(
            Message(
                MessageType.HEARTBEAT,
                to=node,
                frm=core.id,
                term=core.term,
                commit=min(pr.match, core.log.committed),
                context=context,
            )
        )
        pr.quiet_ticks, pr.on_beat = 0, True

    def count_tick(self, progress: dict[int, Progress]) -> None:
        """A leader's tick passed: every counter moves (before its deadlines are looked at)."""
        self._elapsed += 1
        for pr in progress.values():
            pr.quiet_ticks += 1  # the leader's own never matters (skipped below)

    def send_due(self, progress: dict[int, Progress]) -> None:
        """The heartbeats due at this tick (after `count_tick`)."""
        core = self._core
        interval = core.config.heartbeat_ticks
        context = core.reads.latest_context()
        if self._elapsed >= interval:
            self._elapsed = 0
            if context:  # a read waits for its answers: every follower hears its context again
                self.broadcast(progress, context)
                return
        followers = [(node, pr) for node, pr in sorted(progress.items()) if node != core.id]
        if any(pr.quiet_ticks >= interval for _, pr in followers):
            half = (interval + 1) // 2
            for node, pr in followers:
                if pr.quiet_ticks >= interval or (pr.on_beat and pr.quiet_ticks >= half):
                    self._send(node, pr, context)

    def ticks_until_due(self, progress: dict[int, Progress]) -> int:
        """Ticks from now until a heartbeat is due: the quietest follower's, or a waiting read's
        repeat (at least 1; a leader without followers never has one before a read)."""
        core = self._core
        interval = core.config.heartbeat_ticks
        due = core.config.election_ticks
        for node, pr in progress.items():
            if node != core.id:
                due = min(due, interval - pr.quiet_ticks)
        if core.reads.latest_context():
            due = min(due, interval - self._elapsed)
        return max(1, due)


__all__ = ["Heartbeats"]
