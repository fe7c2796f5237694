"""The routing rule (queues/sets/routing.py) and the set table's codec (queues/sets/table.py)."""

from __future__ import annotations

import collections

import pytest

from queues.sets import routing, table
from queues.sets.table import Epoch, EpochState, SetTable, TableError

KEYS = [f"red-packet:{n}" for n in range(30_000)]
E1 = Epoch(1, (1,))
E2 = Epoch(2, (1, 2, 3))
E3 = Epoch(3, (1, 2, 3, 4))


def test_jump_hash_matches_the_reference_implementations_values() -> None:
    # The test vectors of github.com/dgryski/go-jump (a port of the paper's C++ function).
    assert routing.jump(1, 1) == 0
    assert routing.jump(42, 57) == 43
    assert routing.jump(0xDEAD10CC, 1) == 0
    assert routing.jump(0xDEAD10CC, 666) == 361
    assert routing.jump(256, 1024) == 520


def test_keys_spread_within_ten_percent_over_three_sets() -> None:
    spread = collections.Counter(routing.candidate(key, E2) for key in KEYS)
    assert set(spread) == {1, 2, 3}
    for count in spread.values():
        assert abs(count - 10_000) <= 1_000, spread


def test_adding_a_set_moves_only_the_new_sets_share() -> None:
    moved = [key for key in KEYS if routing.candidate(key, E2) != routing.candidate(key, E3)]
    assert all(routing.candidate(key, E3) == 4 for key in moved)  # a key moves only to the new set
    assert abs(len(moved) - len(KEYS) / 4) <= len(KEYS) * 0.025  # about a quarter of the keys


def test_a_key_needs_a_lookup_only_when_its_candidate_changed() -> None:
    epochs = (E1, E2, E3)
    for key in KEYS[:3000]:
        found = routing.candidates(key, epochs)
        asked = routing.lookups(key, epochs)
        assert asked == tuple(dict.fromkeys(s for s in found[:-1] if s != found[-1]))
    assert routing.lookups("k", (E1,)) == ()


def test_home_is_the_oldest_epochs_candidate_that_holds_the_key() -> None:
    key = next(k for k in KEYS if routing.candidates(k, (E1, E2, E3)) == [1, 2, 4])
    assert routing.home(key, (E1, E2, E3), holders=()) == 4  # seen nowhere: the newest epoch's
    assert routing.home(key, (E1, E2, E3), holders=(2,)) == 2
    assert routing.home(key, (E1, E2, E3), holders=(2, 1)) == 1  # the oldest epoch wins
    assert routing.home(key, (E1, E2, E3), holders=(3,)) == 4  # not a candidate: not its home


def test_the_stable_hash_is_blake2b_of_the_utf8_key() -> None:
    # Fixed forever: a change would send every replay to another set.
    assert routing.key_hash("a") == 0x40F89E395B66422F
    assert routing.key_hash("ключ") != routing.key_hash("key")


def test_a_table_round_trips_and_grows_by_epochs() -> None:
    first = table.first_table({1: ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]})
    grown, epoch = table.with_new_sets(first, [("127.0.0.1:7101",), ("127.0.0.1:7201",)])
    assert epoch == Epoch(2, (1, 2, 3), EpochState.PENDING)
    assert grown.active() == (Epoch(1, (1,)),)
    assert table.decode(table.encode(grown)) == grown
    done = table.activated(grown, 2)
    assert done.newest_active() == Epoch(2, (1, 2, 3))
    assert done.addresses()[3] == ("127.0.0.1:7201",)


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (SetTable(sets=(table.SetEntry(1, ("h:1",)),), epochs=(Epoch(2, (1,)),)), "numbered"),
        (SetTable(sets=(table.SetEntry(1, ("h:1",)),), epochs=(Epoch(1, (2,)),)), "unknown set"),
        (SetTable(sets=(table.SetEntry(1, ("h:1",)), table.SetEntry(2, ("h:1",)))), "two sets"),
        (SetTable(sets=(table.SetEntry(1, ("nope",)),)), "host:port"),
        (SetTable(sets=(table.SetEntry(0, ("h:1",)),)), "outside"),
        (
            SetTable(sets=(table.SetEntry(1, ("h:1",)), table.SetEntry(2, ("h:2",))),
                     epochs=(Epoch(1, (1, 2)), Epoch(2, (2, 1)))),
            "extend",
        ),
    ],
)  # fmt: skip
def test_a_bad_table_is_refused_in_one_line(bad: SetTable, says: str) -> None:
    with pytest.raises(TableError, match=says):
        table.validate(bad)
    with pytest.raises(TableError):
        table.decode(b'{"sets": 3}')


def test_a_pending_epoch_must_be_finished_before_another_is_added() -> None:
    first = table.first_table({1: ["h:1"]})
    grown, _ = table.with_new_sets(first, [("h:2",)])
    with pytest.raises(TableError, match="pending"):
        table.with_new_sets(grown, [("h:3",)])
    with pytest.raises(TableError, match="two sets"):
        table.with_new_sets(table.activated(grown, 2), [("h:2",)])


def test_a_sets_addresses_change_one_node_at_a_time() -> None:
    """`compensator sets addresses`: a replaced node's address swapped in keeps a majority of the
    set's addresses; a list that keeps no majority could be another set's nodes and is refused."""
    start = table.first_table({1: ("h1:7001", "h2:7001", "h3:7001"), 2: ("h1:7002", "h2:7002", "h3:7002")})
    moved = table.readdressed(start, 2, ("h1:7002", "h2:7002", "h4:7002"))
    assert moved.addresses() == {1: start.addresses()[1], 2: ("h1:7002", "h2:7002", "h4:7002")}
    assert moved.epochs == start.epochs
    assert table.readdressed(start, 2, ("h1:7002", "h2:7002", "h3:7002", "h4:7002")).addresses()[2][-1] == "h4:7002"
    for set_id, addresses, says in [
        (2, ("h1:7002", "h4:7002", "h5:7002"), "keep 1 of its 3"),
        (2, ("h1:7001", "h2:7001", "h3:7001"), "keep 0 of its 3"),  # set 1's nodes
        (2, ("h1:7002", "h2:7002", "h3:7002"), "already at"),
        (3, ("h1:7003",), "no set 3"),
        (2, ("h1:7002", "h2:7002", "h1:7001"), "belongs to two sets"),
    ]:
        with pytest.raises(TableError, match=says):
            table.readdressed(start, set_id, addresses)
