"""The log's clock (raft_store/log_clock.py): follows the majority's time, never goes back, never
freezes, and one node's clock (slow, fast, or fast-running) cannot move it."""

from __future__ import annotations

import pytest

from raft_store import codec
from raft_store.log import RaftLog
from raft_store.log_clock import BAND_MS, SAMPLE_TTL_MS, LogClock
from raft_store.node_clock import NodeClock
from raft_store.state_machine import encode_batch, latest_stamp_ms
from raft_store.types import ConfState, Entry, EntryKind, Message, MessageType, SnapshotMeta

T0 = 1_700_000_000_000
VOTERS = frozenset({1, 2, 3})


def leader(committed_ms: int = 0) -> LogClock:
    clock = LogClock(1)
    clock.set_role(leading=True, leader=1, voters=VOTERS)
    clock.committed(committed_ms)
    return clock


def hear(clock: LogClock, mono_ms: int, **walls: int) -> None:
    """Peers n2, n3 ... say their wall clocks at local monotonic time `mono_ms`."""
    for name, wall in walls.items():
        clock.heard(int(name[1:]), wall_ms=wall, clock_ms=0, mono_ms=mono_ms)


def test_a_node_that_knows_nothing_reads_its_own_clock_without_keeping_it() -> None:
    clock = LogClock(1)
    assert clock.read(wall_ms=T0 + 30_000, mono_ms=0) == T0 + 30_000
    clock.committed(T0)
    assert clock.read(wall_ms=T0 + 30_000, mono_ms=5) == T0  # the fast wall reading left no trace


@pytest.mark.parametrize("own_offset_ms", [-30_000, 30_000])
def test_one_skewed_leader_reads_the_majority_time_and_advances_with_real_time(own_offset_ms: int) -> None:
    clock = leader(committed_ms=T0)
    for step in range(0, 10_001, 50):
        hear(clock, step, n2=T0 + step, n3=T0 + step + 3)
        reading = clock.read(wall_ms=T0 + own_offset_ms + step, mono_ms=step)
        assert T0 + step <= reading <= T0 + step + 3 + BAND_MS, step  # the majority's time, plus the band at most


def test_a_healthy_leader_reads_its_own_clock_between_heartbeats() -> None:
    """Samples trail by up to a heartbeat: where its own clock agrees, the reading is its own clock."""
    clock = leader(committed_ms=T0)
    for real in range(0, 3000, 5):
        if real % 60 == 0:
            hear(clock, real, n2=T0 + real - 2, n3=T0 + real + 1)
        assert clock.read(wall_ms=T0 + real, mono_ms=real) == T0 + real


def test_a_majority_moves_time_forward_and_it_never_comes_back() -> None:
    clock = leader(committed_ms=T0)
    hear(clock, 0, n2=T0 + 30_000, n3=T0)
    assert clock.read(wall_ms=T0 + 30_000, mono_ms=0) == T0 + 30_000  # two of three clocks agree
    readings = []
    for step in range(100, 1100, 100):  # both stepped back: the log stays ahead, and goes on moving
        hear(clock, step, n2=T0 + step, n3=T0 + step)
        readings.append(clock.read(wall_ms=T0 + step, mono_ms=step))
    assert readings == sorted(readings)
    assert readings[0] >= T0 + 30_000
    # Not frozen: it advanced by the monotonic time (never faster than the majority's clocks).
    assert readings[-1] - readings[0] == 900


def test_a_leader_whose_clocks_run_fast_follows_the_majority_not_its_own_rate() -> None:
    """Wall and monotonic clocks at 1.5x on the leader, read many times between heartbeats: its
    reading keeps the peers' pace, at most a heartbeat behind them, never ahead."""
    clock = leader(committed_ms=T0)
    for real in range(0, 20_000, 5):
        fast = real * 3 // 2
        if real % 60 == 0:  # heartbeat answers every 60 ms
            hear(clock, fast, n2=T0 + real, n3=T0 + real + 1)
        reading = clock.read(wall_ms=T0 + fast, mono_ms=fast)
        assert T0 + real - 60 <= reading <= T0 + real + 1 + BAND_MS, real


def test_the_whole_set_restarted_after_an_hour_jumps_to_the_majority_time() -> None:
    hour = 3_600_000
    clock = leader(committed_ms=T0)
    hear(clock, 0, n2=T0 + hour, n3=T0 + hour + 5)
    assert clock.read(wall_ms=T0 + hour - 10, mono_ms=0) == T0 + hour


def test_the_reading_is_never_below_the_committed_time_or_an_earlier_reading() -> None:
    clock = leader(committed_ms=T0)
    hear(clock, 0, n2=T0, n3=T0)
    assert clock.read(wall_ms=T0, mono_ms=0) == T0
    clock.committed(T0 + 5_000)  # a later entry stamped by an earlier leader
    assert clock.read(wall_ms=T0 + 10, mono_ms=10) == T0 + 5_000
    hear(clock, 20, n2=T0 - 60_000, n3=T0 - 60_000)
    assert clock.read(wall_ms=T0 - 60_000, mono_ms=20) >= T0 + 5_000


def test_a_follower_reads_its_leaders_reading_and_holds_without_one() -> None:
    clock = LogClock(2)
    clock.set_role(leading=False, leader=1, voters=VOTERS)
    clock.heard(1, wall_ms=T0 - 30_000, clock_ms=T0, mono_ms=1_000)
    assert clock.read(wall_ms=T0 + 99_000, mono_ms=1_000) == T0  # the leader's reading, not its own clock
    assert clock.read(wall_ms=T0 + 40, mono_ms=1_040) == T0  # between heartbeats: as last heard
    clock.heard(1, wall_ms=T0 - 29_500, clock_ms=T0 + 500, mono_ms=1_500)
    assert clock.read(wall_ms=T0 + 530, mono_ms=1_530) == T0 + 500  # its clock within a band: still the leader's
    later = 1_500 + SAMPLE_TTL_MS + 1_000  # the leader went quiet: its sample is stale, the reading holds
    assert clock.read(wall_ms=T0 + 3_500, mono_ms=later) == T0 + 500
    clock.set_role(leading=False, leader=3, voters=VOTERS)  # a new leader, far ahead: followed at once
    clock.heard(3, wall_ms=T0 + 9_000, clock_ms=T0 + 9_000, mono_ms=later + 10)
    assert clock.read(wall_ms=T0 + 3_510, mono_ms=later + 10) == T0 + 9_000


def test_a_follower_ahead_of_a_new_leader_never_goes_back_and_goes_on_at_its_pace() -> None:
    """The old leader read at the top of its band, the new one reads its base: the follower keeps its
    reading and moves on by the smaller of its monotonic advance and the new leader's."""
    clock = LogClock(2)
    clock.set_role(leading=False, leader=1, voters=VOTERS)
    clock.heard(1, wall_ms=T0, clock_ms=T0 + BAND_MS, mono_ms=1_000)
    assert clock.read(wall_ms=T0, mono_ms=1_000) == T0 + BAND_MS
    clock.set_role(leading=False, leader=3, voters=VOTERS)
    clock.heard(3, wall_ms=T0 + 10, clock_ms=T0 + 10, mono_ms=1_010)
    assert clock.read(wall_ms=T0 + 10, mono_ms=1_010) == T0 + BAND_MS  # never back
    clock.heard(3, wall_ms=T0 + 70, clock_ms=T0 + 70, mono_ms=1_070)
    assert clock.read(wall_ms=T0 + 70, mono_ms=1_070) == T0 + BAND_MS + 60  # on by the leader's advance
    clock.heard(3, wall_ms=T0 + 900, clock_ms=T0 + 900, mono_ms=1_100)  # the leader's reading leaps
    assert clock.read(wall_ms=T0 + 100, mono_ms=1_100) == T0 + 900  # caught up: followed


def test_a_leap_of_the_base_below_a_carried_reading_is_not_a_rate() -> None:
    """A leader 40 s slow at 1.5x, its log carried 5 s ahead: its base is its own clock while one
    peer is quiet, then leaps to the peers' when both are heard. From there the reading goes on at
    the peers' pace, not its own monotonic 1.5x (seed 3001091 of the simulation: 8 % over true time)."""
    clock = leader(committed_ms=T0 + 5_000)
    hear(clock, 0, n3=T0)
    for _ in range(2):  # base: its own clock, far below (the second read finds the reading ahead of it)
        assert clock.read(wall_ms=T0 - 40_000, mono_ms=0) == T0 + 5_000
    hear(clock, 150, n2=T0 + 100, n3=T0 + 100)  # 100 ms of true time, 150 of its monotonic clock
    assert clock.read(wall_ms=T0 - 39_850, mono_ms=150) == T0 + 5_150  # the leap counts no more than the monotonic advance
    hear(clock, 1_500, n2=T0 + 1_000, n3=T0 + 1_000)
    assert clock.read(wall_ms=T0 - 38_500, mono_ms=1_500) == T0 + 6_050  # on by the peers' 900 ms, not 1,350


def test_a_reading_raised_since_it_went_ahead_goes_on_from_where_it_is() -> None:
    """A leader ahead of the majority steps down; the log commits later times under another leader;
    it leads again with the majority still below: its reading goes on from the committed time at the
    majority's pace. Counted from the old anchor it stood still until the base made up the
    difference (seed 3001089 of the queue simulation: a leader's entries 1.1 s at one time)."""
    clock = leader(committed_ms=T0 + 1_000)
    hear(clock, 0, n2=T0, n3=T0)
    assert clock.read(wall_ms=T0, mono_ms=0) == T0 + 1_000  # ahead of the majority (T0): held there
    clock.set_role(leading=False, leader=2, voters=VOTERS)
    clock.committed(T0 + 2_000)  # another leader's entries, applied here
    clock.set_role(leading=True, leader=1, voters=VOTERS)
    hear(clock, 100, n2=T0 + 100, n3=T0 + 100)
    assert clock.read(wall_ms=T0 + 100, mono_ms=100) == T0 + 2_000
    hear(clock, 400, n2=T0 + 400, n3=T0 + 400)
    assert clock.read(wall_ms=T0 + 400, mono_ms=400) == T0 + 2_300  # on by the majority's 300 ms


def test_a_leader_reads_no_lower_than_the_times_its_log_holds() -> None:
    """Seed 3001408 of the queue simulation: a leader restarted (its reading lost) with 1 s of its
    own stamps in its log above what it applied, behind a majority whose time is a slow clock's.
    Read from the applied time, it stamped below its own log, and the log's time stood still 1 s."""
    clock = LogClock(1)
    clock.committed(T0 + 4_343)  # what its machine applied before the restart
    clock.set_role(leading=True, leader=1, voters=VOTERS)
    clock.logged(T0 + 5_344)  # its log's unapplied entries, stamped before the restart
    hear(clock, 0, n2=T0 - 10_000)  # n3 cut off: the majority's time is n2's, 10 s slow
    assert clock.read(wall_ms=T0 + 6_000, mono_ms=0) == T0 + 5_344
    hear(clock, 100, n2=T0 - 9_900)
    assert clock.read(wall_ms=T0 + 6_100, mono_ms=100) == T0 + 5_344  # ahead of the majority: counted from here
    hear(clock, 400, n2=T0 - 9_600)
    assert clock.read(wall_ms=T0 + 6_400, mono_ms=400) == T0 + 5_644  # on at the majority's pace


def test_the_times_a_log_holds_count_only_while_its_node_leads() -> None:
    """A follower's log may hold entries the next leader overwrites, and a follower reads its leader's
    reading: `logged` is no floor of it, nor of a later lead (which says its own log anew)."""
    clock = LogClock(1)
    clock.set_role(leading=False, leader=2, voters=VOTERS)
    clock.logged(T0 + 9_000)
    clock.heard(2, wall_ms=T0, clock_ms=T0 + 100, mono_ms=0)
    assert clock.read(wall_ms=T0, mono_ms=0) == T0 + 100
    clock.set_role(leading=True, leader=1, voters=VOTERS)
    clock.logged(T0 + 200)
    hear(clock, 0, n2=T0, n3=T0)
    assert clock.read(wall_ms=T0, mono_ms=0) == T0 + 200
    clock.set_role(leading=False, leader=0, voters=VOTERS)
    clock.set_role(leading=True, leader=1, voters=VOTERS)
    hear(clock, 5, n2=T0 - 5_000, n3=T0 - 5_000)
    assert clock.read(wall_ms=T0 - 5_000, mono_ms=5) == T0 + 200  # never back, and 9_000 never counted


def _log(*stamps: int, applied: int) -> RaftLog:
    entries = [Entry(1, i, EntryKind.NORMAL, encode_batch(t, [(1, i, b"x" * i)])) for i, t in enumerate(stamps, 1)]
    entries.append(Entry(2, len(stamps) + 1, EntryKind.NOOP))  # a new leader's no-op: no stamp
    entries.append(Entry(2, len(stamps) + 2, EntryKind.NORMAL, b"\xff" * 13))  # no batch: no stamp
    meta = SnapshotMeta(0, 0, ConfState(voters=VOTERS))
    return RaftLog(meta, entries, committed=applied, applied=applied)


def test_a_node_taking_the_lead_tells_its_clock_the_stamps_it_has_not_applied() -> None:
    """raft_store/node.py's side (NodeClock.follow_log): the greatest stamp above what it applied,
    whatever order the terms left them in; entries without a batch stamp nothing."""
    log = _log(T0 + 900, T0 + 500, T0 + 800, T0 + 700, applied=1)
    assert latest_stamp_ms(log.entries_after(log.applied)) == T0 + 800
    assert latest_stamp_ms(log.entries_after(4)) == 0
    clock = NodeClock(1, band_ms=BAND_MS, wall=lambda: T0 - 30_000, monotonic=lambda: 0)
    clock.follow_log(log)
    clock.committed(T0 + 100)
    clock.set_role(True, 1, VOTERS)
    assert clock.read_ms() == T0 + 800


def test_a_leader_without_a_majority_of_fresh_samples_holds_its_reading() -> None:
    """Its own clocks alone (fast here) would carry the log's time ahead: it waits for the others."""
    clock = leader(committed_ms=T0)
    hear(clock, 0, n2=T0, n3=T0)
    assert clock.read(wall_ms=T0, mono_ms=0) == T0
    far = SAMPLE_TTL_MS + 500  # both peers silent: only its own clock, not a majority of three
    assert clock.majority_ms(wall_ms=T0 + 40_000, mono_ms=far) is None
    assert clock.read(wall_ms=T0 + 40_000, mono_ms=far) == T0
    hear(clock, far, n2=T0 + far, n3=T0 + far)
    assert clock.read(wall_ms=T0 + 40_000, mono_ms=far) == T0 + far + BAND_MS


def test_a_single_voter_is_its_own_majority() -> None:
    clock = LogClock(1)
    clock.set_role(leading=True, leader=1, voters=frozenset({1}))
    assert clock.read(wall_ms=T0, mono_ms=0) == T0
    assert clock.read(wall_ms=T0 + 250, mono_ms=250) == T0 + 250


def test_raft_messages_carry_both_clocks_and_older_messages_still_decode() -> None:
    message = Message(MessageType.HEARTBEAT, to=2, frm=1, term=3, commit=7, context=b"r")
    plain = codec.encode_message(message)
    assert codec.decode_message(plain) == message
    stamped = codec.encode_message(message, wall_ms=T0 + 1, clock_ms=T0)
    assert len(stamped) == len(plain) + 16
    decoded = codec.decode_message(stamped)
    assert (decoded.wall_ms, decoded.clock_ms) == (T0 + 1, T0)
    with pytest.raises(codec.CodecError):
        codec.decode_message(stamped + b"\x00")


def test_only_a_message_only_leaders_send_carries_a_reading_a_follower_takes() -> None:
    """A vote request delayed in the network carries what its sender read before it led (its own
    clock, 30 s fast): it must not become the follower's time."""
    clock = LogClock(2)
    clock.set_role(leading=False, leader=1, voters=VOTERS)
    clock.heard_message(Message(MessageType.HEARTBEAT, to=2, frm=1, term=2, wall_ms=T0 + 30_000, clock_ms=T0),
                        mono_ms=0)  # fmt: skip
    clock.heard_message(Message(MessageType.VOTE, to=2, frm=1, term=2, wall_ms=T0 + 30_000, clock_ms=T0 + 30_000),
                        mono_ms=5)  # fmt: skip
    assert clock.read(wall_ms=T0, mono_ms=10) == T0


def test_ahead_of_the_majority_it_goes_on_at_the_majoritys_pace_read_often_or_not() -> None:
    """After a majority's clocks stepped back, readings many times between heartbeats still advance
    at the rate of real time (by the base's advance since it went ahead, not read by read)."""
    clock = leader(committed_ms=T0 + 30_000)  # the log ran 30 s ahead of every clock
    for real in range(0, 2001, 5):
        if real % 60 == 0:
            hear(clock, real, n2=T0 + real, n3=T0 + real)
        reading = clock.read(wall_ms=T0 + real, mono_ms=real)
    assert T0 + 30_000 + 2000 - 60 <= reading <= T0 + 30_000 + 2000



def test_a_lead_counted_against_one_base_is_not_carried_on_against_another() -> None:
    """A leader ahead of its majority's time goes on at that time's rate; when it becomes a
    follower, its new base is another leader's reading, and the lead is counted afresh from there.
    Counted from the old anchor, a fast monotonic clock's advance jumped the reading ahead at once
    (simulation seed 25000217, 5 nodes with membership, a node 9 % fast: 312 ms in 22 ms)."""
    clock = LogClock(2)
    clock.set_role(leading=True, leader=2, voters=VOTERS)
    clock.committed(T0 + 1000)  # the log is 1 s ahead of the majority's time
    assert clock.read(wall_ms=T0, mono_ms=0) == T0 + 1000
    for real in range(100, 2001, 100):  # its monotonic clock runs 20 % fast
        clock.heard(1, wall_ms=T0 + real, clock_ms=0, mono_ms=real * 6 // 5)
        clock.heard(3, wall_ms=T0 + real, clock_ms=0, mono_ms=real * 6 // 5)
        assert clock.read(wall_ms=T0 + real, mono_ms=real * 6 // 5) == T0 + 900 + real  # the majority's rate
    clock.set_role(leading=False, leader=3, voters=VOTERS)
    clock.heard(3, wall_ms=T0 + 2000, clock_ms=T0 + 2850, mono_ms=2400)  # n3's reading, just below ours
    assert clock.read(wall_ms=T0 + 2000, mono_ms=2400) == T0 + 2900  # holds: no jump
    clock.heard(3, wall_ms=T0 + 2100, clock_ms=T0 + 2950, mono_ms=2520)
    assert clock.read(wall_ms=T0 + 2100, mono_ms=2520) == T0 + 2950  # then the leader's, once it passes ours
