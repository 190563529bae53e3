"""The Linux capabilities by name, in the kernel's numbering (``[tools.isolation]
keep_capabilities`` names them; the confinement drops every other one)."""

from __future__ import annotations

CAPABILITY_NAMES = (
    "chown", "dac_override", "dac_read_search", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap",
    "linux_immutable", "net_bind_service", "net_broadcast", "net_admin", "net_raw", "ipc_lock", "ipc_owner",
    "sys_module", "sys_rawio", "sys_chroot", "sys_ptrace", "sys_pacct", "sys_admin", "sys_boot", "sys_nice",
    "sys_resource", "sys_time", "sys_tty_config", "mknod", "lease", "audit_write", "audit_control", "setfcap",
    "mac_override", "mac_admin", "syslog", "wake_alarm", "block_suspend", "audit_read", "perfmon", "bpf",
    "checkpoint_restore",
)  # fmt: skip


def capability_number(name: str) -> int:
    """``CAP_NET_BIND_SERVICE`` or ``net_bind_service`` → 10. Raises ValueError."""
    return CAPABILITY_NAMES.index(name.lower().removeprefix("cap_"))
