"""How much of a shared pool one uid may hold (the pools themselves are attacked in
``tests/security/test_q_one_user_cannot_hold_every_worker.py``)."""

from __future__ import annotations

from toold_daemon.pool_shares import per_uid_share


def test_by_default_a_quarter_of_the_pool_and_at_least_one_worker_stay_for_the_others() -> None:
    assert [per_uid_share(n, 0) for n in (1, 2, 3, 4, 8, 16, 256)] == [1, 1, 2, 3, 6, 12, 192]


def test_a_configured_share_is_kept_within_the_pool() -> None:
    assert per_uid_share(8, 3) == 3
    assert per_uid_share(8, 8) == 8  # the administrator's choice: one uid may take them all
    assert per_uid_share(4, 100) == 4
