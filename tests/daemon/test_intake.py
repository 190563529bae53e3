"""The pump's intake: frames served one uid at a time, in rotation."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from toold_daemon.service.intake import Intake


def frames_of(intake: Intake[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
    taken = []
    while intake:
        taken.append(intake.take())
    return taken


def test_a_uid_with_many_frames_waiting_takes_turns_with_one_that_has_a_single_frame() -> None:
    intake: Intake[tuple[bytes, int]] = Intake(lambda frame: frame[0])
    for n in range(100):
        intake.add(1000, (b"busy%d" % (n % 10), n), 10)
    intake.add(1001, (b"victim", 0), 10)
    taken = frames_of(intake)
    assert taken.index((b"victim", 0)) == 1  # after one of the busy uid's, not after 100
    assert intake.waiting == 0 and intake.bytes == 0


def test_dropping_a_gone_peer_keeps_its_uids_other_connections_and_the_counts() -> None:
    intake: Intake[tuple[bytes, int]] = Intake(lambda frame: frame[0])
    for n in range(6):
        intake.add(7, (b"a" if n % 2 else b"b", n), 100)
    intake.add(8, (b"c", 0), 5)
    intake.drop(7, b"a")
    assert (intake.waiting, intake.bytes) == (4, 305)
    assert intake.holds(7, b"b") and not intake.holds(7, b"a") and not intake.holds(9, b"b")
    intake.drop(8, b"c")  # the uid's last frame: it leaves the rotation
    intake.drop(9, b"nobody")
    assert frames_of(intake) == [(b"b", 0), (b"b", 2), (b"b", 4)]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), max_size=60))
def test_every_connection_keeps_its_order_and_nothing_is_lost(arrivals: list[tuple[int, int]]) -> None:
    intake: Intake[tuple[bytes, int]] = Intake(lambda frame: frame[0])
    for seq, (uid, connection) in enumerate(arrivals):
        intake.add(uid, (b"%d:%d" % (uid, connection), seq), 1)
    taken = frames_of(intake)
    assert sorted(seq for _, seq in taken) == list(range(len(arrivals)))
    for peer in {peer for peer, _ in taken}:
        mine = [seq for who, seq in taken if who == peer]
        assert mine == sorted(mine)
    # while two uids have frames waiting, neither is served twice in a row
    uids = [int(peer.split(b":")[0]) for peer, _ in taken]
    left = {uid: uids.count(uid) for uid in set(uids)}
    for before, after in itertools.pairwise(uids):
        left[before] -= 1
        others_waiting = any(count for uid, count in left.items() if uid != before)
        assert not (before == after and others_waiting)
