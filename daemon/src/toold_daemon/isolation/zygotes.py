"""The trio side of zygotes (see ``zygote``): one per kind of command, started on first
use through the spawner, retired after a while, and asked to start each command.

A kind is everything confinement depends on: uid, gid, roots, writable paths, network
and the required layers. A zygote serves ``MAX_SPAWNS`` commands or ``MAX_AGE_S``
seconds, whichever comes first (it is one process under the calls' rlimits, so its CPU
time and threads add up); then its socket is closed and it exits once its last command
has been reported. At most ``MAX_ZYGOTES`` live at once, least recently used retired
first.

Starting a zygote takes tens of milliseconds (a fork of the spawner, confinement, a
cgroup), which the command that found its kind's zygote worn out used to wait for: one
command in every thousand took ten times as long as the others. A zygote that will wear
out within ``RENEW_AHEAD_SPAWNS`` commands or ``RENEW_AHEAD_S`` seconds now has its
successor started beside it, in the background, and the successor takes over when it
does.

With cgroups, a zygote waits in a fresh call cgroup ("parked"): the next command is
started there, so its call's cgroup holds it from its first instruction, and only then
is the zygote moved on to a new one. Creating and moving happen after the command is
started, while it runs, not before, and in a thread, never on the event loop: making
the cgroup costs 0.3 ms (a mkdir and limits in each hierarchy), the move usually ~0.1 ms,
but moving a process between cgroups takes a kernel lock whose writer may first wait out
an RCU grace period, and about one move in four took 5 to 14 ms on the machine we
measured; on the loop, that stalled every client's calls. The parked zygote counts
against the cgroup's process limit, so a fresh cgroup allows one process more until the
zygote has left; the call then has its budget, however fast it forks. (A command that
forks in the instant between the zygote's move and the lowering of the limit keeps one
process more: lowering first would instead refuse a fork the call is owed.)
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import msgspec
import trio

from .cgroup import Cgroups, CgroupUnavailable, write_procs
from .sockets import PeerGone, receive_frame, receive_frame_with_fds, send_with_fd
from .wire import Outcome, Spawned, SpawnRequest, frame

log = logging.getLogger(__name__)
MAX_ZYGOTES = 8
MAX_SPAWNS = 1000
MAX_AGE_S = 600.0
RENEW_AHEAD_SPAWNS = 50
RENEW_AHEAD_S = 60.0
_READY_TIMEOUT_S = 10.0
_CLOSE_WAIT_S = 1.0

#: Threads that move zygotes between cgroups, apart from trio's default limiter (which
#: name lookups share): a burst of slow lookups must not hold up starting commands.
_MOVERS = trio.CapacityLimiter(8)

_outcome_decoder = msgspec.msgpack.Decoder(Outcome)
_spawned_decoder = msgspec.msgpack.Decoder(Spawned)

Kind = tuple[
    int, int, tuple[str, ...], tuple[str, ...], bool, bool, bool, bool, tuple[str, ...], tuple[str, ...],
    tuple[str, ...], tuple[str, ...], bool,
]  # fmt: skip
# (request for the zygote itself, its socket end to hand over) -> the zygote's pid
StartChild = Callable[[SpawnRequest, int], Awaitable[int]]


class ZygoteUnavailable(Exception):
    """No zygote could serve this command (the caller falls back to a fresh child; the
    command may have started if the zygote died mid-request, so it sweeps first)."""


class ZygoteStale(Exception):
    """The zygote's roots were replaced (removed and made again) since it started."""


class CommandNotStarted(Exception):
    """The zygote is fine but could not start this command (bad cwd, no such program)."""


class held:  # lower case, as contextlib.suppress: it reads as what it does
    """Hold ``lock``; taken at once when it is free. trio's ``acquire`` always passes
    through the scheduler, even for a free lock: on a command's path (the pool, then the
    zygote) that was two trips round the event loop, about 50 µs each under load. The
    command's path has checkpoints enough of its own (the request, the reply). A class
    rather than ``asynccontextmanager``, whose generator costs twice as much (1.9 µs
    against 0.9 µs here), twice per command."""

    __slots__ = ("_lock",)

    def __init__(self, lock: trio.Lock) -> None:
        self._lock = lock

    async def __aenter__(self) -> None:
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    async def __aexit__(self, *_exc: object) -> None:
        self._lock.release()


def kind_of(request: SpawnRequest) -> Kind:
    return (
        request.uid,
        request.gid,
        tuple(request.roots),
        tuple(request.writable),
        request.network,
        request.network_namespace,
        request.egress_proxy,
        request.narrow_reads,
        tuple(request.require),
        tuple(request.readonly_paths),
        tuple(request.hidden_patterns),
        tuple(request.protected_patterns),
        request.protect_homes,
    )


#: The layers a zygote builds from what lies below the roots (the probe at start cannot
#: know them): a workspace's own state, worth a warning when one of them holds only in part.
_VIEW_LAYERS = ("denied_files", "protected_paths", "readonly_paths")


def _warn_of_partial_views(layers: dict[str, str]) -> None:
    for name in _VIEW_LAYERS:
        state = layers.get(name, "")
        if state.startswith("partial"):
            log.warning("commands' isolation layer %s: %s", name, state)


class Leaving(msgspec.Struct, frozen=True, eq=False):
    """A zygote on its way out of the cgroup of a command it started: its pid (which that
    call's kill spares meanwhile), and ``done``, set once it is out."""

    pid: int
    done: trio.Event


class Zygote(msgspec.Struct, eq=False):
    pid: int
    sock: trio.socket.SocketType
    home: str  # its own cgroup when not parked ("" without cgroups)
    layers: dict[str, str]
    cgroups: Cgroups
    new_group: Callable[[], str]  # a fresh call cgroup, or "" when none can be made
    pids_max: int = 0  # a call's process limit, set on its cgroup once the zygote has left
    egress: trio.socket.SocketType | None = None  # proxy mode: the link to its egress process
    parked: str = ""  # the fresh cgroup it waits in: the next command's
    inside: str = ""  # a call's cgroup it has started a command in and not left yet
    nursery: trio.Nursery | None = None  # where it leaves a call's cgroup, after the call started
    abandoned: list[str] = msgspec.field(default_factory=list)  # call cgroups of failed spawns
    born: float = msgspec.field(default_factory=time.monotonic)
    spawned: int = 0
    lock: trio.Lock = msgspec.field(default_factory=trio.Lock)

    def worn_out(self) -> bool:
        return self.spawned >= MAX_SPAWNS or time.monotonic() - self.born > MAX_AGE_S

    def wears_out_soon(self) -> bool:
        """Time to start its successor."""
        return (
            self.spawned >= MAX_SPAWNS - RENEW_AHEAD_SPAWNS or time.monotonic() - self.born > MAX_AGE_S - RENEW_AHEAD_S
        )

    def cgroups_in_use(self) -> list[str]:
        """Every cgroup this zygote may still be in (to remove once it has exited)."""
        return [group for group in (self.home, self.parked, self.inside, *self.abandoned) if group]

    async def spawn(self, request: SpawnRequest, channel_write_end: int) -> tuple[int, str, Leaving | None]:
        """Start one command in the cgroup the zygote is parked in, which becomes the call's;
        then park the zygote again: (pid, which leads its own group; the call's cgroup; the
        zygote's way out of that cgroup, which the call's kill must not reach).
        Parking again (a cgroup made, the zygote moved: in a thread, ~0.1 ms, at times ms) happens
        behind the call, while its command runs. Shielded: once the zygote has the request,
        the reply must be read, and the zygote must leave the call's cgroup, whatever
        cancels the caller."""
        async with held(self.lock):
            with trio.CancelScope(shield=True):
                if self.home and not self.parked:
                    await self.park()
                    if not self.parked:
                        raise ZygoteUnavailable("no cgroup to start the command in")
                group = self.parked
                if request.egress_proxy and group:  # its proxy serves its own connections only
                    request = msgspec.structs.replace(request, socket_cgroup=self.cgroups.socket_id(group))
                try:
                    await send_with_fd(self.sock, frame(request), channel_write_end)
                    reply = _spawned_decoder.decode(await receive_frame(self.sock))
                except BaseException:
                    if group:  # the zygote died mid-request: what it may have started goes too
                        self.cgroups.kill(group)
                        self.abandoned.append(group)
                        self.parked = ""
                    raise
                left = None
                if group:
                    self.parked, self.inside = "", group
                    started = not reply.error and reply.pid > 0
                    if started and self.nursery is not None:
                        left = Leaving(self.pid, trio.Event())
                        self.nursery.start_soon(self._leave_later, group, left.done)
                    else:
                        await self._leave(group)
        self.spawned += 1
        if reply.error or reply.pid <= 0:
            self.cgroups.remove(group)
            if reply.stale:
                raise ZygoteStale(reply.error)
            raise CommandNotStarted(reply.error or "no pid")
        return reply.pid, group, left

    async def park(self) -> bool:
        """Wait in a fresh cgroup, so the next command starts in its own without a move on
        its path; else at home. False when the zygote could not leave its current cgroup
        (it must not stay in a call's cgroup: that call's kill would reach it). The moves
        run in a thread (see the module's docstring); the zygote's state changes here, on
        the loop."""
        fresh = await trio.to_thread.run_sync(self._into_fresh_group, limiter=_MOVERS)
        if fresh:
            self.parked, self.inside = fresh, ""
            return True
        self.parked = ""
        left = not self.home or await self._move(self.home)
        if left:
            self.inside = ""
        return left

    def _into_fresh_group(self) -> str:
        """In a thread: make a fresh call cgroup and move the zygote into it (its name), or
        leave nothing made (""). Making one is a few mkdirs and limit writes in every
        hierarchy, 0.3 ms at the median and up to 0.8 ms here, which the event loop
        would otherwise pay for every command, everyone else's calls waiting."""
        fresh = self.new_group()
        if not fresh:
            return ""
        if self._enter(fresh):
            return fresh
        self.cgroups.remove(fresh)
        return ""

    async def _move(self, group: str) -> bool:
        """Move the zygote into ``group``, in a thread, with nothing else there."""
        return await trio.to_thread.run_sync(self._enter, group, limiter=_MOVERS)

    def _enter(self, group: str) -> bool:
        """(In a thread.) Write the zygote's pid to ``group``'s ``cgroup.procs`` everywhere."""
        opened = self.cgroups.open_procs(group)
        return opened is not None and write_procs(opened, self.pid)

    async def _leave(self, group: str) -> None:
        """Leave call cgroup ``group`` for a fresh one (unless an earlier park already
        did), then give the call its own process limit."""
        if self.inside == group and not await self.park():
            log.warning("zygote %d cannot leave a call's cgroup; retiring it", self.pid)
            self.spawned = MAX_SPAWNS  # that call's kill will end it
            return
        self.cgroups.limit_pids(group, self.pids_max)

    async def _leave_later(self, group: str, left: trio.Event) -> None:
        try:
            async with self.lock:  # the next command waits for a fresh cgroup
                with trio.CancelScope(shield=True):  # the zygote must not stay in the call's
                    await self._leave(group)
        finally:
            left.set()

    def close(self) -> None:
        """Retire: the zygote finishes what runs, and its egress process (which dies with
        it) keeps serving those commands; the runner closes the link at its end."""
        self.sock.close()


class Zygotes:
    def __init__(self, start_child: StartChild, cgroups: Cgroups, pids_max: int, memory_max: int) -> None:
        self._start_child = start_child
        self._cgroups = cgroups
        self._limits = (pids_max, memory_max)
        self._pool: OrderedDict[Kind, Zygote] = OrderedDict()
        self._successors: dict[Kind, Zygote] = {}  # started ahead, for when the pool's wears out
        self._renewing: set[Kind] = set()  # kinds whose successor is starting
        self._starting = trio.Lock()
        self._homes_to_remove: list[str] = []  # cgroups of retired zygotes, removed once empty
        self.nursery: trio.Nursery | None = None  # where zygotes leave calls' cgroups
        #: Serves a proxy-mode zygote's link to its egress process (set by the runner).
        self.on_egress: Callable[[trio.socket.SocketType], None] | None = None

    def __len__(self) -> int:
        """Zygotes alive now (successors waiting to take over included)."""
        return len(self._pool) + len(self._successors)

    async def spawn(self, request: SpawnRequest, channel_write_end: int) -> tuple[int, str, Leaving | None]:
        """Start the command in ``request`` through the zygote of its kind: (pid, the
        call's cgroup or "", the zygote's way out of it)."""
        zygote = await self._zygote(request)
        try:
            try:
                return await zygote.spawn(request, channel_write_end)
            except ZygoteStale:  # a workspace made anew: a fresh zygote confines to the new one
                self._retire(kind_of(request), zygote)
                zygote = await self._zygote(request)
                return await zygote.spawn(request, channel_write_end)
        except (OSError, PeerGone, ZygoteUnavailable, msgspec.DecodeError, ZygoteStale) as exc:
            self._retire(kind_of(request), zygote)
            raise ZygoteUnavailable(str(exc)) from None

    def egress_of(self, request: SpawnRequest) -> trio.socket.SocketType | None:
        """The link to the egress process of the zygote that serves ``request``'s kind."""
        zygote = self._pool.get(kind_of(request))
        return zygote.egress if zygote is not None else None

    async def _zygote(self, request: SpawnRequest) -> Zygote:
        kind = kind_of(request)
        async with held(self._starting):
            zygote = self._pool.get(kind)
            if zygote is not None and zygote.worn_out():
                self._retire(kind, zygote)
                zygote = None
            if zygote is None:
                zygote = self._take_successor(kind)
            if zygote is None:
                while len(self._pool) >= MAX_ZYGOTES:
                    oldest = next(iter(self._pool))
                    self._retire(oldest, self._pool[oldest])
                zygote = await self._start(request)
            self._pool[kind] = zygote
            self._pool.move_to_end(kind)
        if zygote.wears_out_soon() and kind not in self._successors and kind not in self._renewing:
            self._renew(kind, request)
        return zygote

    def _take_successor(self, kind: Kind) -> Zygote | None:
        """The successor started for ``kind``, if it is ready and has not worn out itself
        (waiting, it ages too)."""
        successor = self._successors.pop(kind, None)
        if successor is not None and successor.worn_out():
            self._retire_zygote(successor)
            return None
        return successor

    def _renew(self, kind: Kind, request: SpawnRequest) -> None:
        """Start ``kind``'s successor in the background, without the start lock: the
        commands of this kind go on through the zygote they have meanwhile."""
        if self.nursery is None or len(self) + len(self._renewing) > MAX_ZYGOTES:
            return  # no room for one more process now: the next start happens on demand
        self._renewing.add(kind)
        self.nursery.start_soon(self._start_successor, kind, request)

    async def _start_successor(self, kind: Kind, request: SpawnRequest) -> None:
        try:
            successor = await self._start(request)
        except Exception as exc:  # (never out of the runner's nursery: it serves everyone)
            log.warning("a zygote's successor could not start (%s); one starts on demand", exc)
            return
        finally:
            self._renewing.discard(kind)
        current = self._pool.get(kind)
        if current is not None and current.wears_out_soon() and kind not in self._successors:
            self._successors[kind] = successor
        else:  # its kind was retired meanwhile, or a command could not wait and started another
            self._retire_zygote(successor)

    async def _start(self, request: SpawnRequest) -> Zygote:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:  # (its name must be new: one taken would leave the zygote, and its commands, outside)
            home = self._cgroups.create(
                f"zygote-{secrets.token_hex(8)}", pids_max=self._limits[0], memory_max=self._limits[1]
            )
        except CgroupUnavailable as exc:
            ours.close()
            theirs.close()
            raise ZygoteUnavailable(str(exc)) from None
        zygote_request = msgspec.structs.replace(
            request,
            argv=[],
            env={},
            files={},
            zygote=True,
            cgroups=self._cgroups.paths(home),
            call_id="zygote",
            token="",
        )
        sock = trio.socket.from_stdlib_socket(ours)
        try:
            pid = await self._start_child(zygote_request, theirs.fileno())
        except BaseException:
            sock.close()
            if home:
                self._cgroups.remove(home)
            raise
        finally:
            theirs.close()
        zygote = Zygote(
            pid=pid,
            sock=sock,
            home=home,
            layers={},
            cgroups=self._cgroups,
            new_group=functools.partial(self._new_group, proxied=request.egress_proxy),
            pids_max=self._limits[0],
            nursery=self.nursery,
        )
        try:
            with trio.fail_after(_READY_TIMEOUT_S):
                body, fds = await receive_frame_with_fds(sock)
                ready = _outcome_decoder.decode(body)
        except (OSError, PeerGone, msgspec.DecodeError, trio.TooSlowError) as exc:
            self._retire_zygote(zygote)
            raise ZygoteUnavailable(f"the zygote did not start: {exc}") from None
        except BaseException:  # cancelled while it started: it must not live on, unlisted
            self._retire_zygote(zygote)
            raise
        if not ready.ok:
            self._retire_zygote(zygote)
            raise ZygoteUnavailable(ready.error_message)
        zygote.layers = dict(ready.layers)
        _warn_of_partial_views(zygote.layers)
        if fds:  # proxy mode: the link to the zygote's egress process
            zygote.egress = trio.socket.from_stdlib_socket(socket.socket(fileno=fds[0]))
            for extra in fds[1:]:
                os.close(extra)
            if self.on_egress is not None:
                self.on_egress(zygote.egress)
        if home:
            await zygote.park()  # so that even the first command needs no move
        return zygote

    def _new_group(self, *, proxied: bool) -> str:
        """A call cgroup to park a zygote in (a kept one when there is one, see
        ``Cgroups.call_group``): one process over the call's limit, for the zygote itself.
        ``proxied``: its commands' connections go through the egress proxy, which tells
        them apart by the id of the cgroup that made them, so a kept one gets an id of
        its own; the others need none (their sockets cannot reach a proxy's loopback)."""
        pids_max, memory_max = self._limits
        try:
            return self._cgroups.call_group(pids_max=pids_max + 1, memory_max=memory_max, new_id=proxied)
        except CgroupUnavailable as exc:  # parked nowhere: its next command goes to a fresh child
            log.warning("no fresh cgroup for a zygote: %s", exc)
            return ""

    def _retire(self, kind: Kind, zygote: Zygote) -> None:
        """Retire the pool's zygote of ``kind``. Its successor stays only when it wore out
        (``_zygote`` takes it over); a zygote retired for any other reason (the least
        recently used, a workspace made anew, a zygote gone bad) takes its successor along."""
        if self._pool.get(kind) is zygote:
            del self._pool[kind]
        self._retire_zygote(zygote)
        if not zygote.worn_out() and (successor := self._successors.pop(kind, None)) is not None:
            self._retire_zygote(successor)

    def _retire_zygote(self, zygote: Zygote) -> None:
        zygote.close()  # it exits once its last command has been reported
        self._homes_to_remove += zygote.cgroups_in_use()
        self._homes_to_remove = [home for home in self._homes_to_remove if not self._cgroups.remove(home)]

    def close(self) -> None:
        """Retire every zygote, and remove their cgroups once they have exited (each exits
        as soon as its socket closes, when it has no command left to report)."""
        for kind, zygote in list(self._pool.items()):
            self._retire(kind, zygote)
        for successor in self._successors.values():
            self._retire_zygote(successor)
        self._successors.clear()
        deadline = time.monotonic() + _CLOSE_WAIT_S
        while self._homes_to_remove and time.monotonic() < deadline:
            time.sleep(0.005)
            self._homes_to_remove = [home for home in self._homes_to_remove if not self._cgroups.remove(home)]
