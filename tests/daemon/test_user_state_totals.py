"""What one user keeps in memory and todos is bounded in all scopes together, on a real
SQLite file: the totals follow every write, survive reopening, and are counted from the
rows of a file kept before they existed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toold_daemon.records.user_state import Full, UserState

ALICE, BOB = 1000, 1001


def counted(path: Path, uid: int) -> tuple[int, int]:
    """The totals counted from the rows themselves (what the kept totals must equal)."""
    db = sqlite3.connect(path)
    try:
        (memory_bytes,) = db.execute(
            "SELECT COALESCE(SUM(length(CAST(key AS BLOB)) + length(CAST(value AS BLOB))), 0) FROM memory WHERE uid=?",
            (uid,),
        ).fetchone()
        (todos,) = db.execute("SELECT COUNT(*) FROM todos WHERE uid=?", (uid,)).fetchone()
        return int(memory_bytes), int(todos)
    finally:
        db.close()


def test_the_memory_budget_holds_across_scopes_and_other_users_keep_theirs(tmp_path: Path) -> None:
    state = UserState.open_in(tmp_path)
    stored = 0
    with pytest.raises(Full, match="max_bytes_per_user = 1000"):
        for n in range(100):  # each workspace is a scope of its own: max_keys alone never stops this
            state.set(ALICE, f"workspace:/w{n}", "k", "v" * 99, max_keys=10, max_bytes=1000)
            stored += 1
    assert stored == 10 and state.held(ALICE) == (1000, 0) == counted(state.path, ALICE)
    assert state.set(BOB, "user", "k", "v" * 99, max_keys=10, max_bytes=1000)  # another uid's budget is its own
    assert state.held(BOB) == (100, 0)


def test_replacing_counts_the_difference_and_deleting_frees_room(tmp_path: Path) -> None:
    state = UserState.open_in(tmp_path)
    state.set(ALICE, "user", "a", "x" * 90, max_keys=10, max_bytes=200)
    state.set(ALICE, "user", "b", "x" * 90, max_keys=10, max_bytes=200)
    assert state.held(ALICE)[0] == 182
    with pytest.raises(Full):
        state.set(ALICE, "user", "a", "x" * 120, max_keys=10, max_bytes=200)  # 30 more would pass 200
    assert not state.set(ALICE, "user", "a", "x" * 10, max_keys=10, max_bytes=200)  # smaller: always fits
    assert state.held(ALICE)[0] == 102
    assert state.delete(ALICE, "user", "b") and not state.delete(ALICE, "user", "b")
    assert state.held(ALICE)[0] == 11 == counted(state.path, ALICE)[0]
    state.set(ALICE, "user", "é", "ü" * 50, max_keys=10, max_bytes=200)  # bytes as UTF-8, not characters
    assert state.held(ALICE)[0] == 11 + 2 + 100 == counted(state.path, ALICE)[0]


def test_the_todo_budget_holds_across_workspaces(tmp_path: Path) -> None:
    state = UserState.open_in(tmp_path)
    four = [("t", "pending")] * 4
    state.replace_todos(ALICE, "workspace:/w0", four, max_todos=5, max_per_user=10)
    state.replace_todos(ALICE, "workspace:/w1", four, max_todos=5, max_per_user=10)
    with pytest.raises(Full, match="max_todos_per_user = 10"):
        state.replace_todos(ALICE, "workspace:/w2", four, max_todos=5, max_per_user=10)
    assert state.todos(ALICE, "workspace:/w2") == []  # refused whole: the transaction rolled back
    assert state.held(ALICE)[1] == 8
    state.replace_todos(ALICE, "workspace:/w0", four[:2], max_todos=5, max_per_user=10)  # a list replaced frees its own
    assert state.held(ALICE)[1] == 6
    for _ in range(4):
        state.add_todo(ALICE, "workspace:/w2", "t", max_todos=5, max_per_user=10)
    with pytest.raises(Full):
        state.add_todo(ALICE, "workspace:/w3", "t", max_todos=5, max_per_user=10)
    state.remove_todo(ALICE, "workspace:/w2", state.todos(ALICE, "workspace:/w2")[0].id)
    state.add_todo(ALICE, "workspace:/w3", "t", max_todos=5, max_per_user=10)
    assert state.held(ALICE) == (0, 10) == counted(state.path, ALICE)
    assert state.add_todo(BOB, "workspace:/w0", "t", max_todos=5, max_per_user=10).id == "1"


def test_totals_survive_reopening_and_are_counted_for_a_file_kept_before_them(tmp_path: Path) -> None:
    state = UserState.open_in(tmp_path)
    state.set(ALICE, "user", "k", "v" * 40, max_keys=10, max_bytes=1000)
    state.add_todo(ALICE, "workspace:/w", "t", max_todos=5, max_per_user=10)
    state.close()
    again = UserState.open_in(tmp_path)
    assert again.held(ALICE) == (41, 1)
    again.close()
    # A file as a daemon before the totals kept it: its rows, no totals, user_version 0.
    db = sqlite3.connect(again.path)
    db.executescript(
        "DROP TABLE user_totals; PRAGMA user_version = 0;"
        "INSERT INTO memory VALUES (1001, 'workspace:/x', 'kk', 'vvv', 0);"
        "INSERT INTO todos VALUES (1001, 'workspace:/x', '1', 1, 't', 'pending', 0);"
    )
    db.close()
    old = UserState.open_in(tmp_path)
    assert old.held(ALICE) == (41, 1) and old.held(BOB) == (5, 1)
    with pytest.raises(Full):
        old.set(ALICE, "user", "k2", "v" * 1000, max_keys=10, max_bytes=1000)


OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["set", "delete", "add", "remove", "replace"]),
        st.sampled_from([ALICE, BOB]),
        st.sampled_from(["user", "workspace:/a", "workspace:/b"]),
        st.sampled_from(["k1", "k2", "k3", "ключ"]),
        st.integers(min_value=0, max_value=120),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=OPERATIONS)
def test_the_totals_always_equal_the_rows_and_stay_within_budget(
    tmp_path_factory: pytest.TempPathFactory, operations: list[tuple[str, int, str, str, int]]
) -> None:
    state = UserState.open_in(tmp_path_factory.mktemp("state"))
    for action, uid, scope, key, size in operations:
        try:
            if action == "set":
                state.set(uid, scope, key, "é" * size, max_keys=3, max_bytes=400)
            elif action == "delete":
                state.delete(uid, scope, key)
            elif action == "add":
                state.add_todo(uid, scope, key, max_todos=3, max_per_user=5)
            elif action == "remove" and (todos := state.todos(uid, scope)):
                state.remove_todo(uid, scope, todos[size % len(todos)].id)
            elif action == "replace":
                state.replace_todos(uid, scope, [(key, "pending")] * (size % 4), max_todos=3, max_per_user=5)
        except Full:
            pass
        for who in (ALICE, BOB):
            held = state.held(who)
            assert held == counted(state.path, who)
            assert held[0] <= 400 and held[1] <= 5
    state.close()


def test_kept_answers_are_bounded_per_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("toold_daemon.records.user_state.MAX_GRANTS_PER_UID", 3)
    state = UserState.open_in(tmp_path)
    assert all(state.grant(ALICE, f"workspace:/w{n}", "network:example.org:443") for n in range(3))
    assert not state.grant(ALICE, "workspace:/w9", "network:example.org:443")  # a fourth is not kept
    assert not state.granted(ALICE, "workspace:/w9", "network:example.org:443")
    assert state.grant(ALICE, "workspace:/w0", "network:example.org:443")  # one already kept stays kept
    assert state.granted(ALICE, "workspace:/w0", "network:example.org:443")
    assert state.grant(BOB, "workspace:/w0", "network:example.org:443")  # another uid's are its own
