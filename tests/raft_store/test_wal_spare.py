"""Preallocated WAL segments: the log writes into zero-filled, synced space prepared on a thread,
and recovery reads zeros after the last record as unwritten space, never as a torn tail or as
records, while a closed segment never keeps any.

The crash model here is a process kill (what was written survives, synced or not), on real files:
the same contract as tests/raft_store/test_wal.py's, with preallocation on.
"""

from __future__ import annotations

import errno
import logging
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raft_store import framing, wal_spare
from raft_store.framing import CorruptLogError
from raft_store.testing.wal_model import Model, mk, run
from raft_store.types import Entry, EntryKind, HardState
from raft_store.wal import Wal
from raft_store.wal_spare import SPARE_NAME


def _open(directory: Path, segment_bytes: int = 64 << 20) -> Wal:
    wal, rec = Wal.open(directory, segment_bytes=segment_bytes, preallocate=True)
    assert rec.torn_tail is None
    return wal


def _ready(wal: Wal) -> None:
    assert wal.spare is not None
    wal.spare.wait()


def _in_a_spare(directory: Path, entries: list[Entry]) -> tuple[Wal, Path]:
    """A preallocated log whose first segment is an adopted spare holding `entries`, synced."""
    wal = _open(directory)
    _ready(wal)
    wal.append(entries)
    wal.sync()
    (segment,) = wal.segment_paths
    return wal, segment


def _records_end(path: Path) -> int:
    records, _ = framing.scan(path.read_bytes())
    return records[-1].end if records else 0


class PreallocatedWalMachine(RuleBasedStateMachine):
    """Random appends (with overwrites), hard states, syncs, compactions, spares that are or are
    not ready when the log rolls, kills and reopens: what was written is what recovery returns."""

    SEGMENT_BYTES = 300

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="wal-spare-sm-"))
        self.wal = _open(self.dir, self.SEGMENT_BYTES)
        self.model = Model()

    def teardown(self) -> None:
        self.wal.abandon()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(data=st.data(), n=st.integers(1, 5), term=st.integers(1, 4), size=st.integers(0, 90))
    def append(self, data: st.DataObject, n: int, term: int, size: int) -> None:
        first = data.draw(st.integers(self.model.snap_index + 1, self.model.last() + 1), label="first")
        entries = [Entry(term, first + i, EntryKind(i % 3), bytes([first % 251 + 1]) * size) for i in range(n)]
        self.wal.append(entries)
        self.model.append(entries)

    @rule(term=st.integers(0, 4), vote=st.integers(0, 3), commit=st.integers(0, 30))
    def set_hard_state(self, term: int, vote: int, commit: int) -> None:
        self.wal.set_hard_state(HardState(term, vote, commit))
        self.model.hs = HardState(term, vote, commit)

    @rule()
    def sync(self) -> None:
        self.wal.sync()

    @rule()
    def spare_ready(self) -> None:
        _ready(self.wal)

    @precondition(lambda self: self.model.last() >= self.model.snap_index)
    @rule(data=st.data(), matching=st.booleans())
    def compact(self, data: st.DataObject, matching: bool) -> None:
        upto = data.draw(st.integers(self.model.snap_index + 1, self.model.last() + 2), label="upto")
        known = self.model.term_at(upto)
        term = known if matching and known is not None else data.draw(st.integers(1, 4), label="term")
        self.wal.compact(upto, term)
        self.model.compact(upto, term)

    @rule()
    def kill_and_recover(self) -> None:
        self.wal.abandon()
        self.wal, rec = Wal.open(self.dir, segment_bytes=self.SEGMENT_BYTES, preallocate=True)
        self.model.check(rec)
        assert rec.torn_tail is None

    @invariant()
    def closed_segments_end_at_their_last_record(self) -> None:
        for path in self.wal.segment_paths[:-1]:
            assert path.stat().st_size == _records_end(path) > 0

    @invariant()
    def indexes_match(self) -> None:
        assert self.wal.last_index() == self.model.last()


TestPreallocatedWalModel = PreallocatedWalMachine.TestCase
TestPreallocatedWalModel.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_syncs_write_into_the_spare_without_growing_the_file(tmp_path: Path) -> None:
    wal, segment = _in_a_spare(tmp_path, run(1, 10))
    size = segment.stat().st_size
    assert size == wal_spare.FIRST_SPARE_BYTES  # the adopted spare: written into, not grown
    assert not (tmp_path / SPARE_NAME).exists()  # taken; the next is prepared half way through
    for i in range(11, 500, 10):
        wal.append(run(i, i + 9))
        wal.sync()
    assert segment.stat().st_size == size
    wal.abandon()
    wal, rec = Wal.open(tmp_path, preallocate=True)
    assert [e.index for e in rec.entries] == list(range(1, 501)) and rec.torn_tail is None
    wal.append(run(501, 510))  # on into the zeros after the last record
    wal.close()
    assert segment.stat().st_size == size
    _, rec = Wal.open(tmp_path)
    assert [e.index for e in rec.entries] == list(range(1, 511))


def test_a_full_segment_rolls_into_the_spare_and_is_cut_to_its_records(tmp_path: Path) -> None:
    wal = _open(tmp_path, segment_bytes=8 << 20)
    _ready(wal)
    big = 100 << 10
    for i in range(1, 40):
        wal.append([mk(i, 1, bytes([i]) * big)])
        wal.sync()
        _ready(wal)
    first, second, *rest = wal.segment_paths
    assert first.stat().st_size == _records_end(first)  # sealed: no zeros left in a closed segment
    assert second.stat().st_size == _records_end(second)
    assert rest and rest[-1].stat().st_size > _records_end(rest[-1])  # the current one has room
    wal.close()
    _, rec = Wal.open(tmp_path)
    assert [e.index for e in rec.entries] == list(range(1, 40))


def test_a_stale_spare_is_deleted_never_read(tmp_path: Path) -> None:
    wal = _open(tmp_path)
    wal.append(run(1, 3))
    wal.close()
    (tmp_path / SPARE_NAME).write_bytes(b"left by a node killed while filling it" * 1000)
    wal, rec = Wal.open(tmp_path)
    assert [e.index for e in rec.entries] == [1, 2, 3]
    assert not (tmp_path / SPARE_NAME).exists()
    wal.close()


def test_a_segment_killed_before_its_header_was_written_is_dropped_quietly(tmp_path: Path) -> None:
    """The rename made the spare a segment, then the node died before writing into it."""
    wal = _open(tmp_path)
    wal.append(run(1, 3))
    wal.close()
    (tmp_path / "0000000000000002-00000000000000000004.wal").write_bytes(bytes(1 << 20))
    wal, rec = Wal.open(tmp_path, preallocate=True)
    assert [e.index for e in rec.entries] == [1, 2, 3] and rec.torn_tail is None
    assert not (tmp_path / "0000000000000002-00000000000000000004.wal").exists()
    wal.append(run(4, 5))
    wal.close()
    _, rec = Wal.open(tmp_path)
    assert [e.index for e in rec.entries] == [1, 2, 3, 4, 5]


def test_a_torn_record_before_the_zeros_is_cut_and_reported(tmp_path: Path) -> None:
    wal, segment = _in_a_spare(tmp_path, run(1, 3))
    end = _records_end(segment)
    wal.append([mk(4, 1, b"x" * 300)])
    wal.sync()
    wal.abandon()
    buf = bytearray(segment.read_bytes())
    buf[end + 200 : end + 320] = bytes(120)  # the record's last sectors never reached the disk
    segment.write_bytes(bytes(buf))
    wal, rec = Wal.open(tmp_path, preallocate=True)
    assert [e.index for e in rec.entries] == [1, 2, 3]
    assert rec.torn_tail is not None and rec.torn_tail.offset == end
    assert segment.stat().st_size == end
    wal.append(run(4, 6))  # the segment goes on as an ordinary one, and gives way to a spare
    wal.close()
    _, rec = Wal.open(tmp_path)
    assert [e.index for e in rec.entries] == [1, 2, 3, 4, 5, 6]


def test_zeros_closing_a_segment_that_is_not_the_last_refuse_to_open(tmp_path: Path) -> None:
    wal, _ = Wal.open(tmp_path, segment_bytes=100)
    wal.append([mk(1, 1, b"a" * 120)])
    wal.sync()
    wal.append([mk(2, 1, b"b" * 10)])
    wal.close()
    first, _second = sorted(tmp_path.glob("*.wal"))
    with first.open("ab") as f:
        f.write(bytes(4096))
    (tmp_path / SPARE_NAME).write_bytes(bytes(100))
    with pytest.raises(CorruptLogError, match="zero-filled tail in a segment that is not the last"):
        Wal.open(tmp_path)
    assert (tmp_path / SPARE_NAME).exists()  # a refused log's directory is left as it was found


def test_a_spare_that_cannot_be_filled_leaves_the_log_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full_disk(path: Path, size: int, stop: object) -> bool:
        path.write_bytes(b"\0" * 10)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(wal_spare, "fill_zeros", full_disk)
    with caplog.at_level(logging.WARNING, logger="raft_store.wal"):
        wal, _ = Wal.open(tmp_path, segment_bytes=200, preallocate=True)
        for i in range(1, 30):
            wal.append([mk(i, 1, b"p" * 50)])
            wal.sync()
            _ready(wal)
    assert wal.spare is not None and wal.spare.failures >= 2  # tried again at later rolls,
    assert wal.spare.failures <= len(wal.segment_paths) + 1  # once a roll, not at every write
    assert "could not prepare the next segment" in caplog.text and not (tmp_path / SPARE_NAME).exists()
    assert len(wal.segment_paths) > 3
    wal.close()
    _, rec = Wal.open(tmp_path)
    assert [e.index for e in rec.entries] == list(range(1, 30))


def test_volatile_and_preallocated_do_not_mix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not preallocate"):
        Wal.open(tmp_path, volatile=True, preallocate=True)
