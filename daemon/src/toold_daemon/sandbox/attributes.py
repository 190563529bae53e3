"""What a new file takes from the one it stands for: its owner, group and extended
attributes (POSIX ACLs among them). A write is a new file renamed over the old one, and
an undo makes files anew; without this, each would be the writer's, in the writer's
group, with none of them. As far as the writer may give them: another owner only root
may, a group only one of its members, ``trusted.*`` and ``security.*`` only a privileged
writer."""

from __future__ import annotations

import os
import stat

#: A file's owner, group and extended attributes, as an undo gives them back (-1: none).
Attributes = tuple[int, int, dict[str, bytes]]


#: Never carried over to new contents: the kernel drops a file's capabilities when it is
#: written to, so that changed code does not keep the privileges granted to the old.
_NOT_TAKEN_OVER = frozenset({"security.capability"})


def take_over(dir_fd: int, name: str, fd: int) -> None:
    """Give the new file ``fd`` the owner, group and extended attributes (POSIX ACLs
    among them) of the regular file ``name`` (the one it is about to replace, or a moved
    file's source), as far as the writer may: a replacement is a new file, which would
    otherwise be the writer's, in the writer's group, with none of them. Before the mode is set: a change of group
    clears setgid bits."""
    try:
        # Looked at first: opening a device (as root, one may be planted) can do things.
        if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return
        old = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return  # nothing there yet, or nothing the writer may read: nothing to keep
    try:
        if stat.S_ISREG(os.fstat(old).st_mode):
            carry_over(old, fd)
    finally:
        os.close(old)


def carry_over(old: int, new: int) -> None:
    """``old``'s owner, group and extended attributes onto ``new``, as far as the writer may."""
    try:
        names = os.listxattr(old)
    except OSError:
        names = []  # a filesystem without extended attributes
    xattrs = {}
    for attribute in names:
        if attribute in _NOT_TAKEN_OVER:
            continue
        try:
            xattrs[attribute] = os.getxattr(old, attribute)
        except OSError:
            pass
    st = os.fstat(old)
    give_attributes(new, (st.st_uid, st.st_gid, xattrs))


#: What a new file or directory may get from its directory's default ACL when it is made.
_INHERITED = ("system.posix_acl_access", "system.posix_acl_default")


def give_attributes(fd: int, attributes: Attributes) -> None:
    """Give the new file or directory ``fd`` the owner and group (each unless -1) and
    exactly the ACLs and other extended attributes in ``attributes``: an ACL it
    inherited from its directory's default one when it was made, and the one it stands
    for did not have, is taken away again. What the writer may not give is left as it
    is: another owner (only root may), a group the writer is not in, an attribute only
    a privileged writer may set (trusted.*, security.*)."""
    uid, gid, xattrs = attributes
    st = os.fstat(fd)
    owner = uid if uid >= 0 and uid != st.st_uid else -1
    group = gid if gid >= 0 and gid != st.st_gid else -1
    if owner != -1 or group != -1:
        try:
            os.fchown(fd, owner, group)
        except OSError:
            if owner != -1 and group != -1:  # not root: the group alone, where the writer is in it
                try:
                    os.fchown(fd, -1, group)
                except OSError:
                    pass
    for attribute, value in xattrs.items():
        try:
            os.setxattr(fd, attribute, value)
        except OSError:
            pass  # (or a filesystem without extended attributes)
    for attribute in _INHERITED:
        if attribute not in xattrs:
            try:
                os.removexattr(fd, attribute)
            except OSError:
                pass  # none there (ENODATA), or a filesystem without ACLs
