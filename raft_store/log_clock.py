"""The log's clock: the one time by which a set decides what is due, ready, expired or late.

Why it exists: every queue decision (a retry's due time, a lease's deadline, a tombstone's
retention) compares a time written in the log with "now". If "now" were one node's wall clock, a
node 30 s slow that leads froze every due time for 30 s, and a node 30 s fast that took over
expired every open lease at once. So "now" is this reading, the same rule on every node:

* **A majority's time.** The leader's base is the time that a majority of the voters' wall clocks
  have reached (the median of three): its own clock, and each peer's as its last message carried
  it (`Message.wall_ms`; the answers to appends and heartbeats refresh it: the leader sends each
  follower one or the other at least every heartbeat interval, replication.py `Replication.tick`). One node's clock, fast or
  slow, is never the majority's in a set of three. A follower's base is its leader's reading
  (`Message.clock_ms` on the leader's appends and heartbeats). Samples are used as they came,
  never advanced by the local clock (a node whose clocks all run fast would carry time ahead).
* **The leader's own clock where it agrees.** The leader's reading is its own wall clock held
  within [base, base + `band_ms`]: a healthy leader reads its own clock, smooth and current (the
  base trails by up to a heartbeat); a slow one reads the base, a fast one at most `band_ms` above
  it. A follower reads its leader's reading as last heard: its reads (work due, states, long
  polls) never call ready or expired what the leader would not, and it trails the leader by at
  most a heartbeat and a message's flight (a staircase; its own clock is not consulted, so a
  follower's clock, however wrong, changes nothing).
* **Never backwards, never frozen.** The reading never goes below a reading it gave before or the
  greatest time the log committed; nor, on a leader, below the greatest time stamped in the
  entries its log held when it took the lead (`logged`): every one of them commits under it, and
  the machine's time never goes back, so a lower stamp would hold the log's time until the reading
  climbed past it (seed 3001408: a leader restarted from the time it had applied, a second below
  its own stamps that had not committed yet, while a slow clock was the majority's). When it is
  ahead of that (a majority's clocks stepped back, an older version stamped its own clock), it
  goes on by the smaller of the node's monotonic advance and the base's advance since it went
  ahead (a leap of the base, as another clock becomes the majority's, counts for no more than the
  monotonic advance, and the count starts again there), instead of freezing until the majority
  catches up.
  Without a base (an election going on, a follower cut off from its leader) the reading holds: a
  leader always has one (it hears from a majority, or check-quorum deposes it).
* **A whole set that was down agrees that time moved on**: after a restart of every node the
  majority's time is far past the log's, and the reading jumps there (every lease is stale then,
  so nothing is lost by expiring them).

Bound on a jump: a reading is never above the greatest of an earlier reading carried on at the
majority's rate, and the majority's time plus `band_ms`. With at most f of 2f+1 voters' clocks
wrong, the majority's time lies between correct clocks, so a lease granted at log time T for L ms
expires in real time no earlier than L minus how far the majority's time runs ahead of real time
(milliseconds with NTP) minus `band_ms`.

Pure: every time is an argument (wall and monotonic milliseconds read by the node, once per
use), no lock, no I/O. The node serializes calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from raft_store.types import Message, MessageType

SAMPLE_TTL_MS: Final = 2000
"""A peer's clock sample older than this (by the local monotonic clock) is not used: its node may
be gone, or its clock stepped meanwhile. Appends, heartbeats and their answers refresh every
sample many times a second (at least one a heartbeat interval each way)."""
BAND_MS: Final = 120
"""How far above the sampled majority's time a leader's own wall clock is still taken as its
reading (two heartbeats of 60 ms: samples trail true time by up to a heartbeat and a message's
flight, since no follower goes longer than a heartbeat interval without an append or a heartbeat
from its leader, and answers each). Within it the leader reads its own clock, smooth and current; outside it (a clock off by
more) the reading is held to the band. It is also how far ahead of the majority's time a fast
leader's clock can carry the reading. A follower has no band: it reads its leader's reading."""

LEADER_MESSAGES: Final = frozenset({MessageType.APP, MessageType.HEARTBEAT, MessageType.SNAP})
"""Only a leader sends these: their `clock_ms` is a leader's reading. Any other message's is not
taken (a vote request delayed in the network carries what its sender read before it led)."""


@dataclass(slots=True)
class _Sample:
    value_ms: int
    """A wall clock, or a leader's reading, as the sender put it in its message."""
    mono_ms: int
    """The local monotonic clock when the message arrived."""


class LogClock:
    """One node's reading of the log's clock, fed by what it hears and what it applies."""

    def __init__(self, node_id: int, *, sample_ttl_ms: int = SAMPLE_TTL_MS, band_ms: int = BAND_MS) -> None:
        if sample_ttl_ms <= 0 or band_ms < 0:
            raise ValueError("sample_ttl_ms must be positive and band_ms not negative")
        self.node_id = node_id
        self.sample_ttl_ms = sample_ttl_ms
        self.band_ms = band_ms
        self._walls: dict[int, _Sample] = {}
        self._readings: dict[int, _Sample] = {}
        self._committed_ms = 0
        """The greatest time the log committed that this node applied."""
        self._logged_ms = 0
        """While it leads: the greatest time stamped in its log's entries when it took the lead."""
        self._leading = False
        self._leader = 0
        self._voters: frozenset[int] = frozenset({node_id})
        # Invariant: _reading_ms never decreases once _grounded.
        self._reading_ms = 0
        self._grounded = False
        self._ahead: tuple[int, int, int] | None = None
        """(reading, monotonic ms, base) when the reading went ahead of its reference: from there it
        advances by the smaller of the monotonic clock's and the base's advance."""

    # ---- inputs -----------------------------------------------------------------------------
    def heard(self, peer: int, *, wall_ms: int, clock_ms: int, mono_ms: int) -> None:
        """A message from `peer` arrived carrying its wall clock and (0 unless it led) its reading."""
        if peer == self.node_id:
            return
        if wall_ms > 0:
            self._walls[peer] = _Sample(wall_ms, mono_ms)
        if clock_ms > 0:
            self._readings[peer] = _Sample(clock_ms, mono_ms)

    def heard_message(self, m: Message, *, mono_ms: int) -> None:
        """`heard` for a Raft message: its reading counts only on a message only leaders send."""
        self.heard(m.frm, wall_ms=m.wall_ms, clock_ms=m.clock_ms if m.type in LEADER_MESSAGES else 0, mono_ms=mono_ms)

    def committed(self, time_ms: int) -> None:
        """An applied log entry carried this time: the reading is never below it from now on."""
        self._committed_ms = max(self._committed_ms, time_ms)

    def logged(self, time_ms: int) -> None:
        """As it takes the lead (after `set_role`): the greatest time stamped in the entries its log
        holds above what it applied. While it leads, the reading is never below it: a Raft leader's
        log commits whole under it, and the machine's time never goes back, so stamping below its
        own log would hold the log's time still. Not kept past the lead: a follower's log may hold
        entries the next leader overwrites, and a follower reads its leader's reading."""
        if self._leading:
            self._logged_ms = max(self._logged_ms, time_ms)

    def set_role(self, *, leading: bool, leader: int, voters: frozenset[int]) -> None:
        if (leading, leader) != (self._leading, self._leader):
            self._ahead = None  # another base (the majority's, another leader's): counted afresh
            self._logged_ms = 0  # the log's times at the previous lead: `logged` says them anew
        self._leading, self._leader, self._voters = leading, leader, voters

    @property
    def leading(self) -> bool:
        return self._leading

    @property
    def grounded(self) -> bool:
        """The reading rests on the log or on what the node heard, not on its own wall clock alone."""
        return self._grounded

    # ---- the reading ------------------------------------------------------------------------
    def read(self, *, wall_ms: int, mono_ms: int) -> int:
        """The log's clock now. Call with the node's wall and monotonic clocks read just before."""
        base = self.base(wall_ms=wall_ms, mono_ms=mono_ms)
        floor = max(self._committed_ms, self._logged_ms)  # _logged_ms is 0 unless it leads
        if not self._grounded:
            start = max(floor, 0 if base is None else self._within(wall_ms, base))
            if start == 0:
                return wall_ms  # has heard nothing and applied nothing: its own clock, not kept
            self._grounded, self._reading_ms = True, start
            return start
        reading = max(self._reading_ms, floor)  # what the log committed (or holds, led) since counts from here
        if base is not None:
            reference = self._within(wall_ms, base)
            if reference >= reading:
                reading, self._ahead = reference, None
            else:  # ahead of the majority: on at the majority's rate, never faster than monotonic
                ahead = self._ahead
                if ahead is None or base < ahead[2]:
                    ahead = (reading, mono_ms, base)
                mono_advance, base_advance = mono_ms - ahead[1], base - ahead[2]
                projected = ahead[0] + max(0, min(mono_advance, base_advance))
                if projected < reading:
                    # The reading was raised since it went ahead (the log committed a later time
                    # while another node led, say): counted from where it is now. From the old
                    # anchor it stood still until the base made up the difference (seed 3001089:
                    # 1.1 s of a leader's entries at one time).
                    projected, mono_advance, base_advance = reading, 0, 0
                    ahead = (reading, mono_ms, base)
                reading = projected
                if base_advance > mono_advance:
                    # The base leapt (another clock became the majority's, a sample came after a
                    # gap): a leap is not a rate. Counted from here, or a fast monotonic clock would
                    # carry the reading on at its own rate for as long as the base stays below it.
                    ahead = (reading, mono_ms, base)
                self._ahead = ahead
        else:
            # Without a base (no leader heard lately, no majority of fresh samples) it holds: a node
            # whose clocks run fast would otherwise carry the log's time ahead alone. Nor may the
            # time it held count as advance once a base returns: counted afresh from there.
            self._ahead = None
        self._reading_ms = max(reading, floor)
        return self._reading_ms

    def _within(self, wall_ms: int, base: int) -> int:
        """On a leader, its own wall clock where it agrees with the base (the majority's time as
        sampled, which trails by up to a heartbeat): never below it, at most `band_ms` above. On a
        follower the leader's reading itself: a follower's read never runs ahead of what the leader
        would grant (nor stacks a band of its own on the leader's)."""
        if not self._leading:
            return base
        return min(max(wall_ms, base), base + self.band_ms)

    def base(self, *, wall_ms: int, mono_ms: int) -> int | None:
        """What the reading follows: the majority's time on a leader, the leader's reading on a
        follower; None when not known (too few fresh samples, no leader heard lately)."""
        if self._leading:
            return self.majority_ms(wall_ms=wall_ms, mono_ms=mono_ms)
        sample = self._fresh(self._readings, self._leader, mono_ms)
        return None if sample is None else sample.value_ms

    def majority_ms(self, *, wall_ms: int, mono_ms: int) -> int | None:
        """The latest time that a majority of the voters' wall clocks have reached (as sampled), or None."""
        clocks: list[int] = []
        for voter in self._voters:
            if voter == self.node_id:
                clocks.append(wall_ms)
                continue
            sample = self._fresh(self._walls, voter, mono_ms)
            if sample is not None:
                clocks.append(sample.value_ms)
        majority = len(self._voters) // 2 + 1
        if len(clocks) < majority:
            return None
        clocks.sort(reverse=True)
        return clocks[majority - 1]

    def _fresh(self, samples: dict[int, _Sample], peer: int, mono_ms: int) -> _Sample | None:
        sample = samples.get(peer)
        if sample is None or mono_ms - sample.mono_ms > self.sample_ttl_ms:
            return None
        return sample


__all__ = ["BAND_MS", "SAMPLE_TTL_MS", "LogClock"]
