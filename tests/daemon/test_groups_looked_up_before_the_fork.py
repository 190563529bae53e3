"""A child takes its client's groups as the spawner looked them up before the fork (the
lookup in each child loaded the C library's name service modules again, 0.5-1.2 ms a
child); the service's own group is still dropped from them, and a child without them
looks them up itself, as before."""

from __future__ import annotations

import grp
import os
import pwd

import pytest

from toold_daemon.isolation.confine import _drop_identity, supplementary_groups

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="changing identity needs root")
NOBODY = pwd.getpwnam("nobody")


def _in_a_child(groups: list[int] | None, drop: tuple[int, ...] = ()) -> tuple[str, list[int], int]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            said = _drop_identity(NOBODY.pw_uid, NOBODY.pw_gid, drop, groups)
            os.write(write, f"{said}|{','.join(map(str, sorted(os.getgroups())))}|{os.getuid()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    said, groups_text, uid = os.read(read, 4096).decode().split("|")
    os.close(read)
    os.waitpid(pid, 0)
    return said, [int(g) for g in groups_text.split(",") if g], int(uid)


def test_the_groups_given_are_the_groups_taken() -> None:
    said, groups, uid = _in_a_child([NOBODY.pw_gid, 4242, 4343])
    assert (said, groups, uid) == ("on", sorted([NOBODY.pw_gid, 4242, 4343]), NOBODY.pw_uid)


def test_the_services_group_is_dropped_from_groups_looked_up_before() -> None:
    _, groups, _ = _in_a_child([NOBODY.pw_gid, 4242], drop=(4242,))
    assert groups == [NOBODY.pw_gid]


def test_without_them_the_child_looks_them_up_as_before() -> None:
    _, groups, _ = _in_a_child(None)
    expected = supplementary_groups(NOBODY.pw_uid, NOBODY.pw_gid)
    assert expected is not None and groups == sorted(set(expected))
    assert NOBODY.pw_gid in groups


def test_nothing_is_looked_up_where_no_identity_changes() -> None:
    assert supplementary_groups(0, 0) is None  # a root client keeps root's groups
    assert supplementary_groups(-1, -1) is None
    looked_up = supplementary_groups(NOBODY.pw_uid, NOBODY.pw_gid)
    members = {g.gr_gid for g in grp.getgrall() if NOBODY.pw_name in g.gr_mem}
    assert looked_up is not None and set(looked_up) == {NOBODY.pw_gid, *members}
