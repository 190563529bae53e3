"""Ending a call's processes: whatever ends a call (its outcome, a timeout, a cancel, a
crash), everything it started is killed, by its cgroup, its process group and every
escapee carrying its token, until a sweep finds nothing new; then its cgroup is kept for
a later call or removed, and its temp dir given back (for reuse only once the emptied
cgroup proves that nothing of the call can still write there)."""

from __future__ import annotations

import functools
import logging
import os
import signal
from typing import TYPE_CHECKING, Protocol

import msgspec
import trio

from . import sweep as sweeping
from .cgroup import Cgroups

if TYPE_CHECKING:
    from .zygotes import Leaving

log = logging.getLogger(__name__)

#: How long a killed call's processes may take to leave its cgroup before the call ends
#: without it (its temp dir then is not reused, and the cgroup is removed later).
EMPTY_WAIT_SECONDS = 2.0
#: How often a cgroup whose processes outlived that wait is tried again.
LINGERING_RETRY_SECONDS = 1.0


class CallProcess(msgspec.Struct, frozen=True):
    """A started call's child: whoever holds this must kill it (``CallKiller.kill``)."""

    pid: int
    read_end: int
    token: str
    temp: str
    uid: int
    cgroup: str  # its call cgroup's name ("" without one)
    zygote: Leaving | None = None  # the zygote that started it, until it is out of its cgroup
    #: Its first process started inside ``cgroup`` (from a zygote the daemon itself moved
    #: there), under Landlock, which keeps every ``cgroup.procs`` out of its reach: all the
    #: call started is in that cgroup, and once it is killed and emptied, the call is over.
    contained: bool = False


class GiveBackTemp(Protocol):
    async def __call__(self, temp: str, uid: int, *, reusable: bool) -> None: ...


class CallKiller:
    def __init__(self, cgroups: Cgroups, spawner_pid: int, grace_seconds: float, give_back_temp: GiveBackTemp) -> None:
        self.cgroups = cgroups
        self.spawner_pid = spawner_pid
        self._grace_seconds = grace_seconds
        self._give_back_temp = give_back_temp
        #: Where a kill finishes once ``cgroup.kill`` has reached every process (set by the runner).
        self.nursery: trio.Nursery | None = None
        #: Call cgroups whose killed processes were still leaving them when their call ended.
        self.lingering: list[str] = []

    async def kill(self, child: CallProcess) -> None:
        """SIGTERM first when a grace period is configured, then SIGKILL to the call's cgroup,
        its group and every escapee carrying its token, until a sweep pass finds nothing new.

        After ``cgroup.kill``, every process of the call has SIGKILL pending, so the token
        sweep (a check behind the cgroup), waiting for the group to exit, removing the
        cgroup and clearing the temp dir finish in the background; without a cgroup they
        are part of the kill (see ``_finish``)."""
        grace = self._grace_seconds
        if grace > 0 and signal_group(child.pid, signal.SIGTERM):
            with trio.move_on_after(grace):
                while signal_group(child.pid, 0):
                    await trio.sleep(0.02)
        # cgroup.kill reaches every process of the call, whatever session or environment it
        # has now. The zygote that started the call may still be on its way out of the
        # cgroup (a move can wait out an RCU grace period: 5-30 ms for one command in a
        # hundred here): then every process listed there but the zygote is killed, one
        # by one, instead of waiting for it (``_finish`` kills whatever is left after).
        zygote = child.zygote
        if zygote is not None and not zygote.done.is_set():
            killed_by_cgroup = self.cgroups.kill(child.cgroup, spare=zygote.pid)
        else:
            killed_by_cgroup = self.cgroups.kill(child.cgroup)
        killed: set[int] = set()
        if killed_by_cgroup and self.nursery is not None:
            signal_group(child.pid, signal.SIGKILL)
            self.nursery.start_soon(functools.partial(self._finish, child, killed, by_cgroup=True))
            return
        await self._sweep_until_quiet(child.pid, child.token, killed)
        await self._finish(child, killed)

    async def _finish(self, child: CallProcess, killed: set[int], *, by_cgroup: bool = False) -> None:
        """Wait for the call's group to exit; sweep for escapees carrying its token, unless
        its cgroup, killed, empties and the call was contained in it; keep or remove the
        cgroup.

        Skipping the sweep there loses nothing: leaving a cgroup takes write access to
        another one's ``cgroup.procs``, which Landlock keeps out of reach (/sys is outside
        what a command may even read). Without Landlock a root command could leave, so the
        sweep runs (though one able to leave could as well drop the token it looks for).
        The sweep reads every process the spawner has (each zygote, worker and command:
        their /proc children and environ files), so it cost each command more as more
        users ran at once."""
        with trio.CancelScope(shield=True):
            if child.zygote is not None and not child.zygote.done.is_set():
                await child.zygote.done.wait()
                self.cgroups.kill(child.cgroup)  # a zygote that could not leave goes with the call
            # A process being reparented while its parent exits can be missing from both
            # parents' /proc children lists for an instant: once the whole group is gone (no
            # more reparenting), look once more.
            with trio.move_on_after(2.0):
                await wait_exit(child.pid)
                while signal_group(child.pid, 0):
                    await trio.sleep(0.0005)
            # only an emptied cgroup proves nothing of the call can still write
            emptied = by_cgroup and child.contained and await self._emptied(child.cgroup)
            if not emptied:
                await self._sweep_until_quiet(child.pid, child.token, killed)
                emptied = bool(child.cgroup) and await self._emptied(child.cgroup)
                if child.cgroup and not emptied:
                    self._linger(child.cgroup)
            await self._give_back_temp(child.temp, child.uid, reusable=emptied)

    async def _emptied(self, cgroup: str) -> bool:
        """Once the processes leaving ``cgroup`` are gone (within ``EMPTY_WAIT_SECONDS``),
        keep it for a later call or remove it (``Cgroups.release``)."""
        with trio.move_on_after(EMPTY_WAIT_SECONDS):
            while not self.cgroups.release(cgroup):
                await trio.sleep(0.001)
            return True
        return False

    def _linger(self, cgroup: str) -> None:
        """A killed process that takes longer to exit (one waiting in the kernel on a slow
        disk or network filesystem, in uninterruptible sleep) holds its call's cgroup:
        removed once it is gone, not left for the daemon's lifetime."""
        log.warning("processes of cgroup %s outlived their call; it is removed once they exit", cgroup)
        self.lingering.append(cgroup)
        if len(self.lingering) == 1 and self.nursery is not None:
            self.nursery.start_soon(self._remove_lingering)

    async def _remove_lingering(self) -> None:
        while self.lingering:
            await trio.sleep(LINGERING_RETRY_SECONDS)
            for cgroup in self.lingering:
                self.cgroups.kill(cgroup)  # whatever is there carries SIGKILL already; once more
            self.lingering = [cgroup for cgroup in self.lingering if not self.cgroups.remove(cgroup)]

    async def _sweep_until_quiet(self, pid: int, token: str, killed: set[int]) -> None:
        for _ in range(1000):
            if sweeping.sweep_once(self.spawner_pid, pid, token, killed) == 0:
                return
            await trio.sleep(0)


async def wait_exit(pid: int) -> None:
    """Until ``pid`` has exited: a pidfd becomes readable then (no polling)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return  # already gone, or no pidfd support (the caller polls the group anyway)
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)


def signal_group(pgid: int, signum: int) -> bool:
    """Signal a process group; False if it is gone (or not ours to signal)."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True
