"""What the daemon counts as waiting for each connection and each uid, and the bounds
that end a connection (``service.backlog``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from toold_daemon.service.backlog import Backlogs

MB = 1 << 20


def backlogs(peer_bound: int = 4 * MB, uid_bound: int = 10 * MB, reading: set[bytes] | None = None) -> Backlogs:
    seen = reading if reading is not None else set()
    return Backlogs(peer_bound, uid_bound, lambda peer: peer in seen)


def test_a_connection_holding_nothing_gets_one_frame_however_large() -> None:
    counts = backlogs()
    counts.connected(b"a", 1000)
    assert counts.refusal(b"a", 50 * MB) is None
    counts.add_queued(b"a", 50 * MB)
    assert counts.refusal(b"a", 1) is not None  # now it holds something: over both bounds


def test_the_connection_bound_counts_what_waits_in_the_outbox() -> None:
    counts = backlogs(peer_bound=4 * MB)
    counts.connected(b"a", 1000)
    counts.add_queued(b"a", 3 * MB)
    assert counts.refusal(b"a", MB // 2) is None
    refused = counts.refusal(b"a", 2 * MB)
    assert refused is not None and "this client" in refused


def test_what_libzmq_holds_counts_for_the_uid_after_the_outbox_is_dropped() -> None:
    counts = backlogs(uid_bound=10 * MB)
    counts.connected(b"a", 1000)
    counts.add_queued(b"a", 6 * MB)
    counts.handed_over(b"a", 6 * MB)
    counts.add_queued(b"a", 2 * MB)
    counts.drop_queued(b"a")  # the connection was cut off: its outbox goes, libzmq's pipe stays
    assert (counts.queued(b"a"), counts.in_flight(b"a"), counts.uid_held(1000)) == (0, 6 * MB, 6 * MB)
    counts.gone(b"a")
    assert counts.uid_held(1000) == 0


def test_one_uids_connections_share_its_bound_and_other_uids_are_not_touched() -> None:
    counts = backlogs(peer_bound=4 * MB, uid_bound=10 * MB)
    for n in range(3):
        counts.connected(bytes([n]), 1000)
        counts.add_queued(bytes([n]), 3 * MB)
        counts.handed_over(bytes([n]), 3 * MB)
    counts.connected(b"x", 1000)
    refused = counts.refusal(b"x", 2 * MB)  # 9 MB held by the uid's other connections
    assert refused is not None and "this user's clients" in refused
    counts.connected(b"other", 2000)
    assert counts.refusal(b"other", 2 * MB) is None


def test_connections_seen_reading_no_longer_count_against_their_uid() -> None:
    reading: set[bytes] = set()
    counts = backlogs(uid_bound=10 * MB, reading=reading)
    for peer in (b"a", b"b"):
        counts.connected(peer, 1000)
        counts.add_queued(peer, 5 * MB)
        counts.handed_over(peer, 5 * MB)
    counts.connected(b"c", 1000)
    assert counts.refusal(b"c", MB) is not None
    reading.add(b"a")  # it read what it was handed: the uid holds 5 MB, not 10
    assert counts.refusal(b"c", MB) is None
    assert counts.in_flight(b"a") == 0 and counts.uid_held(1000) == 5 * MB
    reading.add(b"b")
    assert counts.held_by_uid() == {}  # what is reported is recounted first


_operations = st.lists(
    st.tuples(
        st.sampled_from(["queue", "hand", "read", "drop", "gone", "connect"]),
        st.integers(0, 3),  # which connection
        st.integers(1, 3 * MB),
    ),
    max_size=60,
)


@given(_operations)
def test_the_uid_totals_are_always_the_sum_of_their_connections(operations: list[tuple[str, int, int]]) -> None:
    counts = backlogs()
    uids = {0: 1000, 1: 1000, 2: 2000, 3: 2000}
    queued: dict[int, int] = {}
    for operation, which, size in operations:
        peer = bytes([which])
        if operation == "connect":
            counts.connected(peer, uids[which])
        elif operation == "queue":
            counts.add_queued(peer, size)
        elif operation == "hand":
            counts.handed_over(peer, min(size, counts.queued(peer)))
        elif operation == "read":
            counts.reading(peer)
        elif operation == "drop":
            counts.drop_queued(peer)
        else:
            counts.gone(peer)
        for uid in (1000, 2000):
            queued[uid] = sum(
                counts.queued(bytes([n])) + counts.in_flight(bytes([n])) for n, owner in uids.items() if owner == uid
            )
            assert counts.uid_held(uid) == queued[uid]
        assert counts.queued(peer) >= 0 and counts.in_flight(peer) >= 0


def test_an_id_taken_by_another_uids_connection_is_not_charged_with_the_old_ones_bytes() -> None:
    counts = backlogs()
    counts.connected(b"a", 1000)
    counts.add_queued(b"a", 3 * MB)
    counts.handed_over(b"a", 3 * MB)
    counts.connected(b"a", 2000)  # a client chose the same routing id under another uid
    assert counts.uid_held(1000) == 0 and counts.in_flight(b"a") == 0
    counts.add_queued(b"a", MB)
    assert (counts.uid_held(1000), counts.uid_held(2000)) == (0, MB)
