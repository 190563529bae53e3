"""Per-session read tracking: what each client session last saw of each file.

``read_file`` records the SHA-256 of a whole-file read (or size and mtime for a line
range); ``edit_file`` and ``apply_patch`` refuse a file whose record is missing or no
longer matches, so an agent never patches a file it has not seen or that changed under
it. Successful writes refresh the record. Bounded per session (least recently used go).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

MAX_RECORDS_PER_SESSION = 10_000
MAX_SESSIONS = 4096


class ReadTracker:
    def __init__(self) -> None:
        self._sessions: OrderedDict[str, OrderedDict[str, str]] = OrderedDict()

    def for_paths(self, session: str, paths: Iterable[str]) -> dict[str, str]:
        records = self._sessions.get(session)
        if not records:
            return {}
        return {p: records[p] for p in paths if p in records}

    def update(self, session: str, changes: dict[str, str]) -> None:
        if not changes:
            return
        records = self._sessions.get(session)
        if records is None:
            records = self._sessions[session] = OrderedDict()
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        for path, record in changes.items():
            if record:
                records[path] = record
                records.move_to_end(path)
            else:
                records.pop(path, None)  # deleted or moved away
        while len(records) > MAX_RECORDS_PER_SESSION:
            records.popitem(last=False)

    def forget(self, session: str) -> None:
        self._sessions.pop(session, None)
