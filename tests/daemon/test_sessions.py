"""The session table: least recently seen order, room made by evicting idle sessions
(overall, or among one uid's), busy sessions never evicted, and each uid's sessions
found without walking everyone's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toold_daemon.service.sessions import Session, Sessions, SessionsFull
from toold_protocol import Identity


def who(uid: int) -> Identity:
    return Identity(uid=uid, gid=uid, pid=1)


def table(max_sessions: int = 8, max_per_uid: int = 4) -> tuple[Sessions, list[Session]]:
    evicted: list[Session] = []
    return Sessions(max_sessions, max_per_uid, evicted.append), evicted


def test_a_peer_keeps_its_session_and_a_new_peer_gets_its_own() -> None:
    sessions, _ = table()
    first = sessions.seen(b"a", who(1000))
    assert sessions.seen(b"a", who(1000)) is first
    assert sessions.seen(b"b", who(1000)) is not first
    assert len(sessions) == 2


def test_a_uid_full_of_sessions_makes_room_by_its_own_idle_session_seen_longest_ago() -> None:
    sessions, evicted = table(max_sessions=8, max_per_uid=3)
    other = sessions.seen(b"other", who(2000))
    _oldest, middle, _newest = (sessions.seen(peer, who(1000)) for peer in (b"o", b"m", b"n"))
    sessions.seen(b"o", who(1000))  # seen again: now the most recent of its uid
    sessions.seen(b"x", who(1000))
    assert evicted == [middle]
    assert {s.peer for s in sessions.of_uid(1000)} == {b"o", b"n", b"x"}
    assert list(sessions.of_uid(2000)) == [other]


def test_busy_sessions_are_never_evicted_and_the_newcomer_is_refused() -> None:
    sessions, evicted = table(max_sessions=8, max_per_uid=2)
    for peer in (b"a", b"b"):
        sessions.seen(peer, who(1000)).running = 1
    with pytest.raises(SessionsFull, match="max_sessions_per_uid"):
        sessions.seen(b"c", who(1000))
    assert evicted == []
    sessions.seen(b"d", who(2000))  # another uid still gets in


def test_a_full_table_makes_room_from_any_uid() -> None:
    sessions, evicted = table(max_sessions=2, max_per_uid=2)
    first = sessions.seen(b"a", who(1000))
    sessions.seen(b"b", who(2000)).running = 1
    sessions.seen(b"c", who(3000))
    assert evicted == [first]
    assert list(sessions.of_uid(1000)) == []


def test_an_ended_session_is_gone_from_its_uid_too() -> None:
    sessions, _ = table()
    session = sessions.seen(b"a", who(1000))
    assert sessions.end(b"a") is session
    assert sessions.end(b"a") is None
    assert list(sessions.of_uid(1000)) == [] and len(sessions) == 0


@settings(max_examples=200)
@given(st.lists(st.tuples(st.sampled_from(["seen", "end", "busy", "idle"]), st.integers(0, 5), st.integers(0, 2))))
def test_each_uids_sessions_are_those_of_the_table_with_that_uid(steps: list[tuple[str, int, int]]) -> None:
    sessions, _ = table(max_sessions=4, max_per_uid=2)
    for action, peer_number, uid in steps:
        peer = bytes([peer_number])
        if action == "seen":
            try:
                sessions.seen(peer, who(uid))
            except SessionsFull:
                pass
        elif action == "end":
            sessions.end(peer)
        else:
            for session in sessions:
                if session.peer == peer:
                    session.running = 1 if action == "busy" else 0
        everyone = list(sessions)
        for uid_seen in range(3):
            assert sorted(s.peer for s in sessions.of_uid(uid_seen)) == sorted(
                s.peer for s in everyone if s.identity.uid == uid_seen
            )
        assert len(everyone) <= 4
