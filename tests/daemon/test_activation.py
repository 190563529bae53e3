"""Reading the socket-activation variables (the real socket is tested end to end)."""

from __future__ import annotations

import os

import pytest

from toold_daemon.operation.activation import ActivationError, take_activated_socket


def test_variables_meant_for_another_process_are_ignored_and_removed() -> None:
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "toold.socket", "KEEP": "x"}
    assert take_activated_socket(env) is None
    assert env == {"KEEP": "x"}


def test_no_activation_without_the_variables() -> None:
    assert take_activated_socket({}) is None


def test_a_count_that_passes_no_socket_is_refused() -> None:
    with pytest.raises(ActivationError, match="passes no socket"):
        take_activated_socket({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "0"})
