"""read_file: a text file or a line range of it; binary files as base64."""

from __future__ import annotations

import base64
import codecs
import hashlib
import os
import stat
from datetime import UTC, datetime
from typing import Annotated, BinaryIO, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from toold_protocol import ToolErrorType

from ..errors import ToolError, bad_args, limits_exceeded
from ..output import Unseen, count_lines
from ..sandbox.reads import read_at_most
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._data import ReadFileData

_MARKER_ROOM = 120  # the marker after a cut base64 body
SNIFF_BYTES = 8192
INLINE_READ_BYTES = 64 * 1024  # whole-file reads up to this size skip the worker thread


class ReadFileArgs(ToolArgs, frozen=True):
    """Read a file inside the workspace. Returns its exact text, or a line range of it."""

    path: Annotated[str, Meta(description="File path relative to the workspace root")]
    start_line: Annotated[int, Meta(ge=1, description="First line to return (1-based, inclusive)")] | UnsetType = UNSET
    end_line: Annotated[int, Meta(ge=1, description="Last line to return (1-based, inclusive)")] | UnsetType = UNSET
    encoding: Annotated[
        Literal["utf-8", "base64"], Meta(description="utf-8 for text; base64 returns the raw bytes encoded")
    ] = "utf-8"
    line_numbers: Annotated[bool, Meta(description="Prefix each line with its number")] = False


def is_binary(sample: bytes) -> bool:
    """NUL bytes or invalid UTF-8 in the sample (an incomplete last character is fine)."""
    if b"\x00" in sample:
        return True
    try:
        codecs.getincrementaldecoder("utf-8")().decode(sample, final=False)
    except UnicodeDecodeError:
        return True
    return False


def number_lines(text: str, first: int) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(f"{first + i:>6}\t{line}" for i, line in enumerate(lines))


class ReadFile(Tool[ReadFileArgs]):
    name = "read_file"
    data_type = ReadFileData
    output = (
        "data: {path, size, modified, sha256 (whole-file reads), encoding: utf-8|base64, "
        "start_line, end_line, total_lines, binary, truncated}"
    )
    description = (
        "Read a file in the workspace. Returns the exact content (or lines start_line..end_line, "
        "1-based inclusive). Binary files are returned base64-encoded with a header."
    )
    args_type = ReadFileArgs

    def validate(self, args: ReadFileArgs) -> None:
        if isinstance(args.start_line, int) and isinstance(args.end_line, int) and args.start_line > args.end_line:
            raise bad_args(f"start_line ({args.start_line}) is after end_line ({args.end_line})")
        if args.encoding == "base64" and (args.start_line is not UNSET or args.end_line is not UNSET):
            raise bad_args("line ranges need encoding utf-8")

    def paths(self, args: ReadFileArgs) -> list[str]:
        return [args.path]

    def summary(self, args: ReadFileArgs) -> str:
        if args.start_line is UNSET and args.end_line is UNSET:
            return f"Read {args.path}"
        end = args.end_line if isinstance(args.end_line, int) else "end"
        start = args.start_line if isinstance(args.start_line, int) else 1
        return f"Read {args.path} (lines {start}-{end})"

    def runs_inline(self, args: ReadFileArgs, ctx: ToolContext) -> bool:
        if args.start_line is not UNSET or args.end_line is not UNSET:
            return False
        try:
            st = os.stat(ctx.resolve(args.path))
        except (OSError, ToolError):
            return True  # the error result is cheap to produce
        return stat.S_ISREG(st.st_mode) and st.st_size <= INLINE_READ_BYTES

    def run(self, args: ReadFileArgs, ctx: ToolContext) -> ToolOutput:
        sandbox = ctx.sandbox
        path = ctx.resolve(args.path)
        shown = sandbox.display(path)
        limits = ctx.config.tools.read_file
        fd, st = sandbox.open_and_stat(path, os.O_RDONLY | os.O_NONBLOCK, display=args.path)
        try:
            _check_regular_file(st, args.path)
        except ToolError:
            os.close(fd)
            raise
        ranged = args.start_line is not UNSET or args.end_line is not UNSET
        if ranged:
            with os.fdopen(fd, "rb") as f:
                raw, first, last = _read_range(f, args, limits.max_scan_bytes, ctx)
        else:
            try:
                raw = _read_whole(fd, st.st_size, args.path, limits.max_file_read_bytes)
            finally:
                os.close(fd)
            first, last = 1, 0
        data: dict[str, object] = {
            "path": shown,
            "size": st.st_size,
            "modified": datetime.fromtimestamp(st.st_mtime, tz=UTC).isoformat(),
        }
        if not ranged:
            data["sha256"] = hashlib.sha256(raw).hexdigest()
            records = {str(path): f"sha256:{data['sha256']}"}
        else:  # a range: the file is known only by its size and modification time
            records = {str(path): f"stat:{st.st_size}:{st.st_mtime_ns}"}
        if args.encoding == "base64":
            data["encoding"] = "base64"
            return ToolOutput(
                base64.b64encode(raw).decode("ascii"),
                f"{shown}: {len(raw)} bytes (base64)",
                data,
                allow_truncation=False,
                records=records,
            )
        if is_binary(raw[:SNIFF_BYTES]) or not _decodes(raw):
            if ranged:
                raise bad_args(f"{args.path} is a binary file: a line range means nothing there; read it whole")
            binary = _binary_output(raw, shown, data, ctx.config.tools.output.max_bytes, args.path)
            return msgspec.structs.replace(binary, records=records)
        text = raw.decode("utf-8")
        if not ranged:
            last = data["total_lines"] = count_lines(text)
        data.update(encoding="utf-8", start_line=first, end_line=last)
        content = number_lines(text, first) if args.line_numbers else text
        return ToolOutput(content, content, data, records=records)


def _check_regular_file(st: os.stat_result, given: str) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise ToolError(
            ToolErrorType.EXECUTION_FAILED, "IS_A_DIRECTORY", f"{given} is a directory; use list_directory", path=given
        )
    if not stat.S_ISREG(st.st_mode):
        raise ToolError(
            ToolErrorType.EXECUTION_FAILED, "NOT_A_REGULAR_FILE", f"{given} is not a regular file", path=given
        )


def _read_whole(fd: int, size: int, given: str, limit: int) -> bytes:
    if size > limit:
        raise ToolError(
            ToolErrorType.FILE_TOO_LARGE,
            "FILE_TOO_LARGE",
            f"{given} is {size} bytes, over the {limit}-byte limit "
            "for whole-file reads; read it in parts with start_line/end_line",
            path=given,
            size=size,
            limit=limit,
        )
    return read_at_most(fd, limit + 1, size)


def _decodes(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _read_range(f: BinaryIO, args: ReadFileArgs, max_scan: int, ctx: ToolContext) -> tuple[bytes, int, int]:
    """Lines start..end (1-based, inclusive), scanning at most ``max_scan`` bytes."""
    start = args.start_line if isinstance(args.start_line, int) else 1
    end = args.end_line if isinstance(args.end_line, int) else None
    scanned = 0
    chunks: list[bytes] = []
    number = 0
    # Each line read at most as far as the scan may still go: iterating the file read a
    # whole line first, and one line of 5 GB (a log without newlines, a sparse file)
    # failed with MemoryError instead of the scan's own limit.
    while line := f.readline(max_scan - scanned + 1):
        number += 1
        scanned += len(line)
        if scanned > max_scan:
            raise limits_exceeded(
                f"reading lines {start}-{end or 'end'} of {args.path} would scan more than {max_scan} bytes "
                "(max_scan_bytes); ask for an earlier or smaller range",
                limit=max_scan,
            )
        if number % 4096 == 0:
            ctx.check_cancelled()
        if number >= start:
            chunks.append(line)
        if end is not None and number >= end:
            break
    last = min(end, number) if end is not None else number
    return b"".join(chunks), start, last


def _binary_output(raw: bytes, shown: str, data: dict[str, object], max_output: int, given: str) -> ToolOutput:
    """The file as base64 under a header; too large for one result, the base64 is cut (on
    a 4-character boundary, so the part shown decodes) with the usual marker."""
    encoded = base64.b64encode(raw).decode("ascii")
    header = f"[binary file {shown}: {len(raw)} bytes, base64-encoded below]\n"
    data.update(encoding="base64", binary=True)
    display = f"[binary file {shown}: {len(raw)} bytes]"
    if len(header) + len(encoded) <= max_output:
        return ToolOutput(header + encoded, display, data, allow_truncation=False)
    room = max(0, max_output - len(header) - _MARKER_ROOM)
    kept = encoded[: room - room % 4]
    shown_bytes = len(base64.b64decode(kept))
    omitted = len(raw) - shown_bytes
    marker = f"\n[output truncated: {omitted} bytes of the file ({len(encoded) - len(kept)} base64 characters) omitted]"
    data["truncated"] = True
    return ToolOutput(
        header + kept + marker, display, data, allow_truncation=False, unseen=Unseen(bytes=len(raw) - shown_bytes)
    )
