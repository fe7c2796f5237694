"""Snapshot store checks: atomic replace under a crash, corruption detection, chunked transfer."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raft_store.files import FaultHook, FsyncFailedError, SimulatedCrash
from raft_store.snapshots import CHUNK_BYTES, CorruptSnapshotError, SnapshotStore, verify
from raft_store.types import ConfState, SnapshotMeta

CONF = ConfState(frozenset({1, 2, 3}), frozenset({7}))


def meta(index: int, term: int = 1, conf: ConfState = CONF) -> SnapshotMeta:
    return SnapshotMeta(index, term, conf)


def data_of(path: Path) -> bytes:
    return b"".join(SnapshotStore.iter_data(path, 4096))


def flip(path: Path, pos: int, bit: int = 0) -> None:
    buf = bytearray(path.read_bytes())
    buf[pos] ^= 1 << bit
    path.write_bytes(bytes(buf))


def test_save_and_latest_roundtrip_keeps_newest_two(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    assert store.latest() is None
    for i in (10, 20, 30):
        store.save(meta(i), f"state@{i}".encode())
    assert [p.name for p in store.paths()] == [
        "snap-00000000000000000030-00000000000000000001.snap",
        "snap-00000000000000000020-00000000000000000001.snap",
    ]
    got = store.latest()
    assert got is not None
    m, path = got
    assert m == meta(30) and data_of(path) == b"state@30"
    assert SnapshotStore.read_meta(path) == meta(30)


def test_large_snapshot_streams_from_a_file(tmp_path: Path) -> None:
    src = tmp_path / "dump.bin"
    payload = bytes(range(256)) * (CHUNK_BYTES * 3 // 256 + 17)
    src.write_bytes(payload)
    store = SnapshotStore(tmp_path / "snaps")
    path = store.save(meta(5, 2), src)
    assert verify(path) == meta(5, 2)
    assert data_of(path) == payload


def test_crash_before_rename_leaves_old_snapshot(tmp_path: Path) -> None:
    SnapshotStore(tmp_path).save(meta(10), b"old")
    crashing = SnapshotStore(tmp_path, fault=FaultHook(crash_before="rename"))
    with pytest.raises(SimulatedCrash):
        crashing.save(meta(20), b"new")
    assert list(tmp_path.glob("*.tmp"))  # the crash left its temp file behind
    restarted = SnapshotStore(tmp_path)
    assert not list(tmp_path.glob("*.tmp"))  # cleaned at start
    got = restarted.latest()
    assert got is not None and got[0] == meta(10) and data_of(got[1]) == b"old"


def test_corrupt_newest_falls_back_and_reports(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    store.save(meta(10), b"a" * 100)
    newest = store.save(meta(20), b"b" * 100)
    flip(newest, 60)
    got = store.latest()
    assert got is not None and got[0] == meta(10)
    assert len(store.reported) == 1 and store.reported[0].path == newest
    assert not newest.exists() and newest.with_name(newest.name + ".corrupt").exists()
    # a later save cannot prune the good fallback in favour of the corrupt file
    store.save(meta(30), b"c")
    assert [SnapshotStore.read_meta(p).index for p in store.paths()] == [30, 10]


def test_only_snapshot_corrupt_raises_every_time(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    path = store.save(meta(10), b"x" * 50)
    flip(path, len(path.read_bytes()) - 20)
    for _ in range(2):
        with pytest.raises(CorruptSnapshotError):
            store.latest()
    assert path.exists()


def test_truncated_snapshot_is_detected(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    path = store.save(meta(10), b"x" * 500)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CorruptSnapshotError):
        store.latest()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.binary(max_size=300),
    index=st.integers(0, 2**63),
    voters=st.frozensets(st.integers(0, 2**64 - 1), max_size=5),
    pos=st.integers(0, 10_000),
    bit=st.integers(0, 7),
)
def test_any_bit_flip_is_detected(
    tmp_path: Path, data: bytes, index: int, voters: frozenset[int], pos: int, bit: int
) -> None:
    store = SnapshotStore(Path(tempfile.mkdtemp(dir=tmp_path)))
    m = SnapshotMeta(index, 3, ConfState(voters, frozenset()))
    path = store.save(m, data)
    assert verify(path) == m and data_of(path) == data
    flip(path, pos % path.stat().st_size, bit)
    with pytest.raises(CorruptSnapshotError):
        store.latest()


def test_chunked_transfer_installs_atomically(tmp_path: Path) -> None:
    leader = SnapshotStore(tmp_path / "leader")
    payload = b"0123456789" * 1000
    path = leader.save(meta(42, 3), payload)
    follower = SnapshotStore(tmp_path / "follower")
    with follower.begin_receive(meta(42, 3)) as w:
        offset = 0
        for chunk in SnapshotStore.iter_chunks(path, 777):
            assert not follower.paths()  # nothing visible until finish
            w.write_chunk(chunk, offset)
            offset += len(chunk)
        installed = w.finish()
    got = follower.latest()
    assert got == (meta(42, 3), installed) and data_of(installed) == payload
    assert SnapshotStore.read_chunk(path, 5, 10) == path.read_bytes()[5:15]


def test_chunked_transfer_rejects_damage_and_wrong_meta(tmp_path: Path) -> None:
    leader = SnapshotStore(tmp_path / "leader")
    path = leader.save(meta(42, 3), b"payload" * 100)
    raw = path.read_bytes()
    follower = SnapshotStore(tmp_path / "follower")

    w = follower.begin_receive(meta(42, 3))
    w.write_chunk(raw[:100])
    with pytest.raises(ValueError):
        w.write_chunk(raw[200:300], offset=200)  # a lost chunk
    w.write_chunk(raw[100:300] + bytes([raw[300] ^ 4]) + raw[301:])
    with pytest.raises(CorruptSnapshotError):
        w.finish()

    w = follower.begin_receive(meta(42, 4))  # header says term 3
    w.write_chunk(raw)
    with pytest.raises(CorruptSnapshotError, match="expected"):
        w.finish()

    with pytest.raises(RuntimeError), follower.begin_receive(meta(42, 3)) as w:
        w.write_chunk(raw[:10])
        raise RuntimeError("connection lost")
    assert follower.latest() is None and not list((tmp_path / "follower").iterdir())


def test_fsync_eio_is_sticky_for_snapshots(tmp_path: Path) -> None:
    hook = FaultHook(fail_fsync_at=1)
    store = SnapshotStore(tmp_path, fault=hook)
    with pytest.raises(FsyncFailedError):
        store.save(meta(1), b"x")
    with pytest.raises(FsyncFailedError):
        store.save(meta(2), b"y")
    assert hook.fsyncs == 1


def test_checkpoint_marker_round_trips_and_retires_older_snapshots(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    conf = ConfState(voters=frozenset({1, 2, 3}))
    store.save(SnapshotMeta(5, 1, conf), b"old state")
    store.save(SnapshotMeta(40, 2, conf), b"newer state")
    assert store.checkpoint() is None
    store.save_checkpoint(SnapshotMeta(20, 2, conf))
    assert store.checkpoint() == SnapshotMeta(20, 2, conf)
    # the snapshot at 5 can serve nobody once the log before 20 is gone; the one at 40 still can
    assert [SnapshotStore.read_meta(p).index for p in store.paths()] == [40]
    store.save_checkpoint(SnapshotMeta(50, 3, conf))
    assert store.checkpoint() == SnapshotMeta(50, 3, conf)
    assert store.paths() == []
    assert store.latest() is None  # a checkpoint is not a snapshot file a follower could be sent


def test_corrupt_checkpoint_is_reported_not_ignored(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    path = store.save_checkpoint(SnapshotMeta(20, 2, ConfState(voters=frozenset({1}))))
    data = bytearray(path.read_bytes())
    data[10] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError):
        SnapshotStore(tmp_path).checkpoint()
