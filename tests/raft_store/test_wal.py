"""WAL checks: a model-based crash test, torn tails, mid-log corruption, group commit, fsync EIO.

The durability claim under test: after a crash, recovery returns exactly the state as of the
last completed sync; a torn tail is truncated and reported; damage anywhere else refuses to
open; an fsync failure stops the WAL for good.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raft_store.files import AppendFile, FaultHook
from raft_store.framing import HEADER_SIZE, CorruptLogError
from raft_store.testing.wal_model import Model, mk, run
from raft_store.types import Entry, EntryKind, HardState
from raft_store.wal import FsyncFailedError, GroupCommitPolicy, Wal


class WalMachine(RuleBasedStateMachine):
    """Random appends (with overwrites), hard states, syncs, compactions, crashes and reopens.

    Volatile mode makes a crash (`abandon`) lose exactly what was not synced, so after a crash the
    recovered state must equal the model as of the last sync, byte for byte.
    """

    SEGMENT_BYTES = 300

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="wal-sm-"))
        self.wal, rec = Wal.open(self.dir, segment_bytes=self.SEGMENT_BYTES, volatile=True)
        self.live = Model()
        self.durable = Model()
        self.live.check(rec)

    def teardown(self) -> None:
        self.wal.abandon()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(data=st.data(), n=st.integers(1, 5), term=st.integers(1, 4), size=st.integers(0, 70))
    def append(self, data: st.DataObject, n: int, term: int, size: int) -> None:
        first = data.draw(st.integers(self.live.snap_index + 1, self.live.last() + 1), label="first")
        entries = [Entry(term, first + i, EntryKind(i % 3), bytes([first % 251]) * size) for i in range(n)]
        self.wal.append(entries)
        self.live.append(entries)

    @rule(term=st.integers(0, 4), vote=st.integers(0, 3), commit=st.integers(0, 30))
    def set_hard_state(self, term: int, vote: int, commit: int) -> None:
        hs = HardState(term, vote, commit)
        self.wal.set_hard_state(hs)
        self.live.hs = hs

    @rule()
    def sync(self) -> None:
        self.wal.sync()
        self.durable = self.live.copy()

    @precondition(lambda self: self.live.last() >= self.live.snap_index)
    @rule(data=st.data(), matching=st.booleans())
    def compact(self, data: st.DataObject, matching: bool) -> None:
        upto = data.draw(st.integers(self.live.snap_index + 1, self.live.last() + 2), label="upto")
        known = self.live.term_at(upto)
        term = known if matching and known is not None else data.draw(st.integers(1, 4), label="term")
        self.wal.compact(upto, term)
        self.live.compact(upto, term)
        self.durable = self.live.copy()  # compact syncs

    @rule()
    def crash_and_recover(self) -> None:
        self.wal.abandon()
        self.wal, rec = Wal.open(self.dir, segment_bytes=self.SEGMENT_BYTES, volatile=True)
        self.durable.check(rec)
        assert rec.torn_tail is None  # volatile mode never leaves a torn record
        self.live = self.durable.copy()

    @rule()
    def close_and_reopen(self) -> None:
        self.wal.close()
        self.wal, rec = Wal.open(self.dir, segment_bytes=self.SEGMENT_BYTES, volatile=True)
        self.live.check(rec)
        assert rec.torn_tail is None
        self.durable = self.live.copy()

    @invariant()
    def indexes_match(self) -> None:
        assert self.wal.last_index() == self.live.last()
        assert self.wal.first_index() == self.live.snap_index + 1


TestWalModel = WalMachine.TestCase
TestWalModel.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_compaction_deletes_segments_and_keeps_hard_state(tmp_path: Path) -> None:
    wal, _ = Wal.open(tmp_path, segment_bytes=200)
    wal.set_hard_state(HardState(3, 2, 40))
    for i in range(1, 41):
        wal.append([mk(i, 3, b"x" * 50)])
        wal.sync()
    before = len(wal.segment_paths)
    wal.compact(35, 3)
    after = wal.segment_paths
    # 2 entries per segment: the one holding 35-36, then 37-38, 39-40 and the one with the marker.
    assert before == 20 and len(after) == 4 and after[0].name.endswith("-00000000000000000035.wal")
    wal.close()
    _, rec = Wal.open(tmp_path, segment_bytes=200)
    assert rec.hard_state == HardState(3, 2, 40)
    assert [e.index for e in rec.entries] == list(range(36, 41))
    assert (rec.first_index, rec.snapshot_index, rec.snapshot_term) == (36, 35, 3)


def test_follower_snapshot_install_discards_conflicting_log(tmp_path: Path) -> None:
    wal, _ = Wal.open(tmp_path)
    wal.append(run(1, 10, term=1))
    wal.compact(20, 2)  # snapshot past our log: discard all
    assert (wal.first_index(), wal.last_index()) == (21, 20)
    wal.append(run(21, 22, term=2))
    with pytest.raises(ValueError):
        wal.append([mk(20, 2)])  # below the snapshot
    with pytest.raises(ValueError):
        wal.append([mk(30, 2)])  # gap
    with pytest.raises(ValueError):
        wal.append([mk(23, 2), mk(25, 2)])  # not contiguous
    wal.close()
    _, rec = Wal.open(tmp_path)
    assert [e.index for e in rec.entries] == [21, 22]


# ---------------------------------------------------------------------------------- torn tails


def _synced_log(directory: Path, n: int, size: int) -> tuple[Path, int, int, list[Entry]]:
    """n synced entries then one more synced entry; returns (segment, last record start, end, prefix)."""
    wal, _ = Wal.open(directory)
    prefix = [mk(i, 1, bytes([i % 256]) * size) for i in range(1, n + 1)]
    wal.append(prefix)
    wal.set_hard_state(HardState(1, 1, n))
    wal.sync()
    (seg,) = wal.segment_paths
    start = seg.stat().st_size
    wal.append([mk(n + 1, 1, b"L" * size)])
    wal.sync()
    wal.close()
    return seg, start, seg.stat().st_size, prefix


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 5), size=st.integers(0, 40))
def test_torn_tail_at_every_offset_is_truncated_and_reported(tmp_path: Path, n: int, size: int) -> None:
    d = Path(tempfile.mkdtemp(dir=tmp_path))
    seg, start, end, prefix = _synced_log(d, n, size)
    original = seg.read_bytes()
    for cut in range(start, end):
        for tail in (b"", bytes(end - cut)):  # a short file, or the size persisted but zeros
            damaged = original[:cut] + tail
            if damaged == original:  # the record's remaining bytes happened to be zeros
                continue
            seg.write_bytes(damaged)
            wal, rec = Wal.open(d)
            wal.abandon()
            assert rec.entries == prefix, cut  # only the unsynced-at-crash record is lost
            assert rec.hard_state == HardState(1, 1, n)
            if cut == start:
                # Nothing of the record, or zeros where it was: unwritten space (a preallocated
                # segment's room), which is not torn, and which the log writes on into.
                assert rec.torn_tail is None
                assert seg.stat().st_size == start + len(tail)
                continue
            assert rec.torn_tail is not None
            assert (rec.torn_tail.path, rec.torn_tail.offset) == (seg, start)
            assert rec.torn_tail.dropped_bytes == cut - start + len(tail)
            assert seg.stat().st_size == start  # truncated on disk
    # After recovery the log continues cleanly from the truncation point.
    wal, _ = Wal.open(d)
    wal.append([mk(n + 1, 2)])
    wal.close()
    _, rec = Wal.open(d)
    assert rec.entries == [*prefix, mk(n + 1, 2)] and rec.torn_tail is None


def test_corrupt_last_record_is_truncated_and_reported_not_silent(tmp_path: Path) -> None:
    seg, _start, end, prefix = _synced_log(tmp_path, 3, 20)
    buf = bytearray(seg.read_bytes())
    buf[end - 3] ^= 0x10
    seg.write_bytes(bytes(buf))
    _, rec = Wal.open(tmp_path)
    assert rec.entries == prefix
    assert rec.torn_tail is not None and "checksum" in rec.torn_tail.reason


def test_torn_header_of_new_segment_drops_segment(tmp_path: Path) -> None:
    wal, _ = Wal.open(tmp_path, segment_bytes=100)
    wal.append([mk(1, 1, b"a" * 120)])
    wal.sync()
    wal.append([mk(2, 1, b"b" * 10)])  # rolls: new segment with header + entry
    wal.sync()
    wal.close()
    _first, second = sorted(tmp_path.glob("*.wal"))
    second.write_bytes(second.read_bytes()[:5])
    _, rec = Wal.open(tmp_path, segment_bytes=100)
    assert [e.index for e in rec.entries] == [1]
    assert rec.torn_tail is not None and rec.torn_tail.path == second and rec.torn_tail.dropped_bytes == 5
    assert not second.exists()


# ------------------------------------------------------------------------- mid-log corruption


def _multi_segment_log(directory: Path, n: int) -> list[Entry]:
    wal, _ = Wal.open(directory, segment_bytes=250)
    entries = [mk(i, 1 + i // 7, bytes([i]) * (i % 30)) for i in range(1, n + 1)]
    for i in range(0, n, 3):
        wal.append(entries[i : i + 3])
        wal.set_hard_state(HardState(1 + i // 7, 1, i))
        wal.sync()
    wal.close()
    return entries


def _last_record_start(buf: bytes) -> int:
    offset, last = 0, 0
    while offset < len(buf):
        last = offset
        offset += HEADER_SIZE + int.from_bytes(buf[offset : offset + 4], "little")
    return last


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_flipped_bit_before_valid_data_refuses_to_open(tmp_path: Path, data: st.DataObject) -> None:
    d = Path(tempfile.mkdtemp(dir=tmp_path))
    _multi_segment_log(d, 20)
    segs = sorted(d.glob("*.wal"))
    assert len(segs) >= 3
    i = data.draw(st.integers(0, len(segs) - 1), label="segment")
    buf = bytearray(segs[i].read_bytes())
    # Anywhere except the final record of the last segment (that one is a torn tail).
    limit = _last_record_start(bytes(buf)) if i == len(segs) - 1 else len(buf)
    pos = data.draw(st.integers(0, limit - 1), label="byte")
    buf[pos] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    segs[i].write_bytes(bytes(buf))
    before = {p: p.read_bytes() for p in segs}
    with pytest.raises(CorruptLogError):
        Wal.open(d, segment_bytes=250)
    assert {p: p.read_bytes() for p in segs} == before  # refused, nothing truncated


def test_index_gap_refuses_to_open(tmp_path: Path) -> None:
    wal, _ = Wal.open(tmp_path)
    wal.append(run(1, 3))
    wal.sync()
    (seg,) = wal.segment_paths
    mid = seg.stat().st_size
    wal.append(run(4, 4))
    wal.sync()
    rec4 = seg.stat().st_size
    wal.append(run(5, 6))
    wal.close()
    buf = seg.read_bytes()
    seg.write_bytes(buf[:mid] + buf[rec4:])  # entry 4 vanished, 5 and 6 intact
    with pytest.raises(CorruptLogError, match="does not follow"):
        Wal.open(tmp_path)


def test_missing_segment_refuses_to_open(tmp_path: Path) -> None:
    _multi_segment_log(tmp_path, 20)
    segs = sorted(tmp_path.glob("*.wal"))
    segs[1].unlink()
    with pytest.raises(CorruptLogError, match="missing"):
        Wal.open(tmp_path, segment_bytes=250)


def test_missing_first_segment_without_compaction_refuses_to_open(tmp_path: Path) -> None:
    _multi_segment_log(tmp_path, 20)
    sorted(tmp_path.glob("*.wal"))[0].unlink()
    with pytest.raises(CorruptLogError, match="missing"):
        Wal.open(tmp_path, segment_bytes=250)


# ---------------------------------------------------------------------------------- group commit


def test_group_commit_policy_bounds() -> None:
    p = GroupCommitPolicy(max_entries=64, max_delay_ms=2.0)
    p.validate()
    assert not p.should_sync(0, 1e9)  # nothing to sync
    assert not p.should_sync(63, 1.999)
    assert p.should_sync(64, 0.0)  # count bound
    assert p.should_sync(1, 2.0)  # time bound
    assert GroupCommitPolicy(1, 0.0).should_sync(1, 0.0)
    for bad in (GroupCommitPolicy(0, 1.0), GroupCommitPolicy(1, -1.0), GroupCommitPolicy(1, float("nan"))):
        with pytest.raises(ValueError):
            bad.validate()


@settings(max_examples=100, deadline=None)
@given(
    max_entries=st.integers(1, 1000),
    max_delay=st.floats(0, 1000),
    n=st.integers(0, 2000),
    age=st.floats(0, 2000),
)
def test_group_commit_policy_property(max_entries: int, max_delay: float, n: int, age: float) -> None:
    p = GroupCommitPolicy(max_entries, max_delay)
    assert p.should_sync(n, age) == (n > 0 and (n >= max_entries or age >= max_delay))


@pytest.mark.parametrize("volatile", [False, True])
def test_one_sync_covers_all_appends_since_the_last(tmp_path: Path, volatile: bool) -> None:
    hook = FaultHook()
    wal, _ = Wal.open(tmp_path, volatile=volatile, fault=hook)
    for i in range(0, 100, 10):
        wal.append(run(i + 1, i + 10))
    wal.set_hard_state(HardState(1, 1, 0))
    assert hook.fsyncs == 0
    stats = wal.sync()
    assert (hook.calls["fsync"], hook.calls["fsync_dir"]) == (1, 1)  # new segment: one dir fsync
    assert stats.entries == 100 and stats.fsyncs == 2
    assert stats.bytes == wal.segment_paths[0].stat().st_size
    # normal mode: one write per append call; volatile: one write per sync
    assert hook.calls["write"] == (1 if volatile else 11)
    for i in range(100, 150, 5):
        wal.append(run(i + 1, i + 5))
    stats = wal.sync()
    assert (hook.calls["fsync"], hook.calls["fsync_dir"]) == (2, 1)
    assert (stats.entries, stats.fsyncs) == (50, 1)
    assert wal.sync() == type(stats)(0, 0, 0) and hook.fsyncs == 3  # nothing pending: no fsync
    wal.abandon()
    _, rec = Wal.open(tmp_path)
    assert [e.index for e in rec.entries] == list(range(1, 151))


# ------------------------------------------------------------------------------------ fsync EIO


@pytest.mark.parametrize("fail_at", [1, 2, 3])  # file fsync, dir fsync, a later file fsync
def test_fsync_eio_is_sticky(tmp_path: Path, fail_at: int) -> None:
    hook = FaultHook(fail_fsync_at=fail_at)
    wal, _ = Wal.open(tmp_path, fault=hook)
    wal.append(run(1, 3))
    if fail_at == 3:
        wal.sync()
        wal.append(run(4, 5))
    with pytest.raises(FsyncFailedError):
        wal.sync()
    calls = hook.fsyncs
    with pytest.raises(FsyncFailedError):
        wal.sync()  # never retried: a retry could "succeed" over lost pages (fsyncgate)
    with pytest.raises(FsyncFailedError):
        wal.append(run(wal.last_index() + 1, wal.last_index() + 1))
    with pytest.raises(FsyncFailedError):
        wal.set_hard_state(HardState(9, 9, 0))
    with pytest.raises(FsyncFailedError):
        wal.compact(1, 1)
    assert hook.fsyncs == calls
    wal.close()  # releases without another fsync
    assert hook.fsyncs == calls


# -------------------------------------------------------------------------- the harness can fail


def test_planted_bug_ack_before_fsync_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync that returns without writing (ack before fsync) must be visible to the crash check."""
    monkeypatch.setattr(AppendFile, "sync", lambda self: None)
    wal, _ = Wal.open(tmp_path, volatile=True)
    wal.append(run(1, 3))
    wal.sync()
    wal.abandon()
    _, rec = Wal.open(tmp_path, volatile=True)
    model = Model(run(1, 3))
    with pytest.raises(AssertionError):
        model.check(rec)


def test_entries_and_hard_state_in_one_append_write_the_same_bytes_as_two_calls(tmp_path: Path) -> None:
    one, _ = Wal.open(tmp_path / "one")
    two, _ = Wal.open(tmp_path / "two")
    for first, hs in ((1, HardState(1, 1, 0)), (4, HardState(1, 1, 2)), (6, HardState(1, 1, 2)), (3, HardState(2, 1, 3))):
        entries = run(first, first + 2, term=hs.term)
        one.append(entries, hs)
        two.append(entries)
        two.set_hard_state(hs)
        one.sync()
        two.sync()
    one.close()
    two.close()
    files_one = sorted(p.read_bytes() for p in (tmp_path / "one").iterdir())
    files_two = sorted(p.read_bytes() for p in (tmp_path / "two").iterdir())
    assert files_one == files_two
    _, recovered = Wal.open(tmp_path / "one")
    assert recovered.hard_state == HardState(2, 1, 3) and recovered.entries[-1].index == 5
