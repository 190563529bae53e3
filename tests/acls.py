"""POSIX ACLs as the kernel stores them in ``system.posix_acl_access`` and
``system.posix_acl_default``: for tests that dress files the way a shared directory
does, without the acl package's tools."""

from __future__ import annotations

import struct

_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_UNDEFINED_ID = 0xFFFFFFFF


def posix_acl(*, owner: int, group: int, other: int, users: dict[int, int]) -> bytes:
    """An ACL giving the file's owner, its group, others and each uid in ``users`` the
    permission bits given (4 read, 2 write, 1 execute); its mask is what they share."""
    mask = group
    for perms in users.values():
        mask |= perms
    entries = [
        (_USER_OBJ, owner, _UNDEFINED_ID),
        *((_USER, perms, uid) for uid, perms in sorted(users.items())),
        (_GROUP_OBJ, group, _UNDEFINED_ID),
        (_MASK, mask, _UNDEFINED_ID),
        (_OTHER, other, _UNDEFINED_ID),
    ]
    return struct.pack("<I", _VERSION) + b"".join(struct.pack("<HHI", *entry) for entry in entries)
