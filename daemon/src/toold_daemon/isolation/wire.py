"""Messages between the trio process, the spawner and a child, and how they are framed.

Every frame is a 4-byte big-endian length and a msgpack body. The spawner's control
socket carries ``SpawnRequest`` (with the write end of the child's channel pipe
attached as SCM_RIGHTS) and ``Spawned`` back; the channel pipe carries ``Chunk``
messages while the child runs and one ``Outcome`` at the end.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Any, Literal, TypeVar

import msgspec

from ..undo.images import Change

MAX_FRAME = 64 * 1024 * 1024
#: Room for the paths and states of a call's pre-images (up to 10,000 of up to PATH_MAX).
_PRE_IMAGE_PATHS = 48 * 1024 * 1024


def outcome_limit(undo_bytes: int) -> int:
    """The most bytes a tool worker's message may have: besides what ``MAX_FRAME`` bounds,
    a mutating call's outcome carries the bytes of its pre-images (up to ``undo_bytes``,
    the batch's undo bound) and their paths. Held to ``MAX_FRAME`` alone, a recursive
    delete of 64 MB of files ran, and its outcome, undo data and all, was refused: the
    files were gone, the call said the worker broke the protocol, and nothing could be
    undone."""
    return MAX_FRAME + undo_bytes + _PRE_IMAGE_PATHS


def request_limit(undo_bytes: int, arguments_bytes: int) -> int:
    """The most bytes a request to a tool worker may have: an undo's carries the saved
    contents it puts back (up to ``undo_bytes``) beside its call's arguments. The daemon
    is the trusted side of that socket; this bounds what a worker holds, not an attack."""
    return max(MAX_FRAME, undo_bytes + arguments_bytes + (1 << 20))


_HEADER = struct.Struct(">I")


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    cpu_seconds: int = 600
    address_space_bytes: int = 4 * 1024**3
    file_size_bytes: int = 1024**3
    open_files: int = 1024
    processes: int = 512


class SpawnRequest(msgspec.Struct, frozen=True, kw_only=True, tag="spawn", omit_defaults=True):
    """Run ``tool`` (a registered Python tool) or, when ``argv`` is set, a command."""

    call_id: str
    token: str  # marks every process of the call (TOOLD_CALL) so a sweep can find escapees
    tool: str = ""
    args: bytes = b""  # the tool's argument struct, msgpack
    config: bytes = b""  # the daemon Config, msgpack
    roots: list[str] = []
    resolved: dict[str, str] = {}
    argv: list[str] = []
    cwd: str = ""
    env: dict[str, str] = {}
    files: dict[str, str] = {}  # written into ``temp`` before argv runs
    temp: str = ""  # the call's private temp dir (TMPDIR), inside one of ``writable``
    uid: int = -1
    gid: int = -1
    network: bool = True
    network_namespace: bool = True  # false: cut the network with seccomp only
    egress_proxy: bool = False  # no network of its own: a filtering proxy is the way out (zygotes)
    egress_budget: int = 1 << 30  # bytes a call may move through the proxy
    socket_cgroup: int = 0  # the call's cgroup id, which its sockets carry: whose proxy connections are its own
    narrow_reads: bool = False  # of /etc only what programs need (``SNIPPET_READ``)
    writable: list[str] = []  # read-write paths besides the roots (the private temp dir)
    limits: Limits = Limits()
    idle_timeout_s: float = 0.0
    stream_limit_bytes: int = 1024 * 1024
    keep_bytes: int = 102_400
    require: list[str] = []
    reads: dict[str, str] = {}
    preview: bool = False  # run the tool's ``preview`` (a diff) instead of ``run``
    cgroups: list[str] = []  # the call's cgroup in each hierarchy, joined first thing
    zygote: bool = False  # confine, then start commands sent over the channel (a socket)
    worker: bool = False  # confine, then run Python tool calls sent over the channel (a socket)
    stdio: bool = False  # confine, then exec argv on the channel (a socket) as stdin and stdout
    readable: list[str] = []  # read+execute besides the system's (an MCP server's own files)
    keep_capabilities: list[str] = []  # left in the bounding set of a root client's processes
    drop_groups: list[int] = []  # supplementary groups a tool process never keeps (the service's)
    readonly_paths: list[str] = []  # bound read-only in the command's own mount namespace
    hidden_patterns: list[str] = []  # denied files below the roots, covered for commands
    protected_patterns: list[str] = []  # existing matches below the roots are read-only for commands
    umask: int = 0o077  # the client's, for the files its command or tool call makes
    protect_homes: bool = False  # homes at or below the roots: read-only but for their non-dot entries
    hide_max_entries: int = 100_000  # entries the search for them may visit
    undo_budget: int = -1  # bytes of pre-images the call may keep for undo (-1: take none)
    blobs: dict[str, bytes] = {}  # saved contents by hash, for ``restore_files``


class TempWanted(msgspec.Struct, frozen=True, kw_only=True, tag="temp"):
    """A private temp dir (a call's TMPDIR) for ``uid``: made by the spawner, which can
    chown it when the protocol process no longer can. The reply carries its path."""

    uid: int
    gid: int


class TempDone(msgspec.Struct, frozen=True, kw_only=True, tag="temp_done"):
    """A temp dir the spawner handed out is free again: pooled if ``reusable`` (nothing of
    the call can still write there) and untouched, else removed."""

    path: str
    reusable: bool = False


SpawnerMessage = SpawnRequest | TempWanted | TempDone


class Spawned(msgspec.Struct, frozen=True, kw_only=True, tag="spawned"):
    pid: int = 0
    error: str = ""
    path: str = ""  # the temp dir, for ``TempWanted``
    stale: bool = False  # a zygote whose roots were replaced since it started: start a new one


class Chunk(msgspec.Struct, frozen=True, kw_only=True, tag="chunk"):
    stream: Literal["stdout", "stderr"]
    data: str


class Outcome(msgspec.Struct, frozen=True, kw_only=True, tag="outcome", omit_defaults=True):
    """The child's last word: a tool output, or a ToolError's parts."""

    ok: bool
    content: str = ""
    display: str | None = None  # None: the same text as ``content`` (sent once)
    data: dict[str, Any] | None = None
    allow_truncation: bool = True
    error_type: str = ""
    error_code: str = ""
    error_message: str = ""
    error_details: dict[str, Any] = {}
    tail: str = ""  # kept after the content by every cut (a command's exit-code line)
    unseen_bytes: int = 0  # output the child produced beyond ``content`` (past what it keeps)
    unseen_lines: int = 0
    layers: dict[str, str] = {}  # isolation layer -> "on" or why it is off
    records: dict[str, str] = {}  # read-tracking records (see ToolOutput.records)
    changes: list[Change] = []  # what the call did to each path it declared (undo)
    # A proxy-mode command whose zygote never gave its listener to the egress process (no
    # connection came): that process never knew the call, so nothing there is to be ended.
    unconnected: bool = False


ChildMessage = Chunk | Outcome
_encoder = msgspec.msgpack.Encoder()
T = TypeVar("T")
child_decoder = msgspec.msgpack.Decoder(ChildMessage)


def failure(type_: str, code: str, message: str, **details: Any) -> Outcome:
    """An outcome that failed: the error's type, code, message and details."""
    return Outcome(ok=False, error_type=type_, error_code=code, error_message=message, error_details=details)


def frame(message: msgspec.Struct) -> bytearray:
    """``message`` encoded behind its length, in one buffer: an undo's request carries up
    to the undo bound, and joining header and body copied it once more on the loop."""
    buffer = bytearray(_HEADER.size)
    try:
        _encoder.encode_into(message, buffer, _HEADER.size)
    except UnicodeEncodeError:  # (rare: a name that is not UTF-8)
        del buffer[_HEADER.size :]
        _encoder.encode_into(_in_utf8(message), buffer, _HEADER.size)
    _HEADER.pack_into(buffer, 0, len(buffer) - _HEADER.size)
    return buffer


def _in_utf8(message: msgspec.Struct) -> msgspec.Struct:
    """``message`` with every text in it made UTF-8. A file name that is not UTF-8
    (``bad\\xff.txt``) comes from the system as text holding lone surrogates, which no
    frame can carry: a tool listing a directory with one such name failed whole. Each
    such byte is shown as U+FFFD, as ripgrep and ls show it."""
    return msgspec.convert(_mended(msgspec.to_builtins(message, builtin_types=(bytes,))), type(message))


def _mended(value: Any) -> Any:
    if isinstance(value, str):
        try:
            raw = value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate no byte stands for
            raw = value.encode("utf-8", "replace")
        return raw.decode("utf-8", "replace")
    if isinstance(value, list):
        return [_mended(item) for item in value]
    if isinstance(value, dict):
        return {_mended(key): _mended(item) for key, item in value.items()}
    return value


def write_frame(fd: int, message: msgspec.Struct) -> None:
    """Write one whole frame to a blocking fd (in the spawner or a child)."""
    view = memoryview(frame(message))
    while view:
        written = os.write(fd, view)
        view = view[written:]


def read_exact(fd: int, size: int, *, after: bytes = b"") -> bytes | None:
    """Read ``size`` bytes from a blocking fd, or None at end of file; ``after``: bytes
    already read, which come first (joined once with the rest, not copied twice)."""
    parts: list[bytes] = [after] if after else []
    while size:
        data = os.read(fd, size)
        if not data:
            return None
        parts.append(data)
        size -= len(data)
    return b"".join(parts)


def close_fds(fds: list[int]) -> None:
    """Close fds received with a frame we will not use (one already closed is fine)."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


#: What the first read of a frame from a peer that takes turns asks for (``alone``).
_TURN_READ = 64 * 1024


def receive_with_fds(
    sock: socket.socket, *, limit: int = MAX_FRAME, alone: bool = False
) -> tuple[bytes, list[int]] | None:
    """One frame from a blocking socket, with the fds attached to its first bytes
    (SCM_RIGHTS); None at end of file. ``limit``: the most bytes a frame may have.

    ``alone``: the peer sends no frame before this one is answered (a worker's daemon),
    so the first read may take what is there, the header and usually the whole body:
    one system call instead of two. Bytes past the frame break that rule: ValueError."""
    first = _HEADER.size + (_TURN_READ if alone else 0)
    data, fds, _flags, _addr = socket.recv_fds(sock, first, 4)
    if not data:
        return None
    if len(data) < _HEADER.size:
        rest = read_exact(sock.fileno(), _HEADER.size - len(data))
        if rest is None:
            return None
        data += rest
    (size,) = _HEADER.unpack_from(data)
    if size > limit:
        raise ValueError(f"frame of {size} bytes is over the limit")
    body = data[_HEADER.size :]
    if len(body) > size:
        raise ValueError("bytes past the frame from a peer that takes turns")
    if len(body) < size:
        whole = read_exact(sock.fileno(), size - len(body), after=body)
        if whole is None:
            return None
        body = whole
    return body, fds


def read_frame(fd: int) -> bytes | None:
    header = read_exact(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is over the limit")
    return read_exact(fd, size)


class FrameBuffer:
    """Splits a byte stream into frame bodies (the trio side reads in arbitrary pieces);
    ``limit``: the most bytes a frame may have."""

    def __init__(self, limit: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self._limit = limit

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; every frame body now complete."""
        self.add(data)
        bodies: list[bytes] = []
        while (body := self.next()) is not None:
            bodies.append(body)
        return bodies

    def add(self, data: bytes) -> None:
        self._buffer += data

    def next(self) -> bytes | None:
        """The next complete frame body, or None until more bytes arrive."""
        end = self._complete()
        if end is None:
            return None
        with memoryview(self._buffer) as view:
            body = bytes(view[_HEADER.size : end])  # (one copy: a slice of the bytearray was another)
        del self._buffer[:end]
        return body

    def decode_next(self, decoder: msgspec.msgpack.Decoder[T]) -> T | None:
        """The next complete frame decoded, or None until more bytes arrive. Decoded where
        it lies: a copy of an outcome carrying an undo's pre-images (up to 64 MiB) took
        50 ms of the loop here."""
        end = self._complete()
        if end is None:
            return None
        with memoryview(self._buffer) as view, view[_HEADER.size : end] as body:
            message = decoder.decode(body)
        del self._buffer[:end]
        return message

    def __len__(self) -> int:
        """Bytes held that no frame has taken yet."""
        return len(self._buffer)

    def peek_next(self, decoder: msgspec.msgpack.Decoder[T]) -> T | None:
        """The next complete frame decoded and left where it is (``drop_next`` takes it)."""
        end = self._complete()
        if end is None:
            return None
        with memoryview(self._buffer) as view, view[_HEADER.size : end] as body:
            return decoder.decode(body)

    def drop_next(self) -> None:
        """Take the next complete frame away, unread."""
        end = self._complete()
        if end is not None:
            del self._buffer[:end]

    def _complete(self) -> int | None:
        """Where the first frame ends, once it is all here."""
        if len(self._buffer) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack_from(self._buffer)
        if size > self._limit:
            raise ValueError(f"frame of {size} bytes is over the limit")
        end = _HEADER.size + size
        return end if len(self._buffer) >= end else None
