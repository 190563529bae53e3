"""``toold doctor``'s "cgroup moves": whether a process entering its call's cgroup waits
out an RCU grace period, and the remount that removes the wait without dropping the
mount's own options (a remount sets cgroup2's options to exactly those it names)."""

from __future__ import annotations

from toold_daemon.operation.checks import cgroup_moves

SYSTEMD_V2 = (
    "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
    "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot 0 0\n"
)
HYBRID = (
    "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n"
    "cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0\n"
    "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
)
BOOT = "BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro quiet"


def test_a_plain_cgroup2_mount_waits_and_the_remount_keeps_its_options() -> None:
    check = cgroup_moves(SYSTEMD_V2, BOOT)
    assert not check.on and not check.required
    assert "5-17 ms" in check.detail
    assert check.detail.endswith("mount -o remount,nsdelegate,memory_recursiveprot,favordynmods none /sys/fs/cgroup")


def test_a_hybrid_layout_names_its_unified_mount() -> None:
    check = cgroup_moves(HYBRID, BOOT)
    assert not check.on and check.detail.endswith("mount -o remount,favordynmods none /sys/fs/cgroup/unified")


def test_favordynmods_as_a_mount_option_or_at_boot_is_reported_on() -> None:
    mounted = SYSTEMD_V2.replace("memory_recursiveprot", "memory_recursiveprot,favordynmods")
    assert cgroup_moves(mounted, BOOT).on
    assert cgroup_moves(SYSTEMD_V2, BOOT + " cgroup_favordynmods=1").on
    assert cgroup_moves(SYSTEMD_V2, BOOT + " cgroup_favordynmods=true").on
    assert not cgroup_moves(SYSTEMD_V2, BOOT + " cgroup_favordynmods=0").on
    assert not cgroup_moves(SYSTEMD_V2.replace("relatime,", "relatime,favordynmodsx,"), BOOT).on


def test_without_cgroup2_the_boot_option_is_the_way() -> None:
    check = cgroup_moves(HYBRID.replace("cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n", ""), BOOT)
    assert not check.on and "cgroup_favordynmods=1" in check.detail


def test_short_or_odd_lines_are_skipped() -> None:
    assert not cgroup_moves("\n   \nnone\ncgroup2 /x\na b cgroup2\n" + SYSTEMD_V2, BOOT).on
