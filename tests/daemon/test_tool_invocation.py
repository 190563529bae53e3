"""For every built-in tool: a description, the locations it touches, and whether a call needs confirmation."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from toold_daemon import policy
from toold_daemon.config import ApprovalConfig
from toold_daemon.tools.builtin import builtin_tools
from toold_protocol import Identity

paths = st.text(alphabet="abcxyz/._-", min_size=1, max_size=40)
EXAMPLES: dict[str, Any] = {
    "read_file": lambda p: {"path": p},
    "read_many_files": lambda p: {"paths": [p, p + "2"]},
    "list_directory": lambda p: {"path": p, "recursive": True},
    "glob": lambda p: {"pattern": "**/*.py", "path": p},
    "grep": lambda p: {"pattern": "x" * 300, "path": p},
    "shell": lambda p: {"command": "ls -la " + "x" * 300, "cwd": p},
    "run_code": lambda p: {"language": "python", "code": f"print({p!r})" + "x" * 300},
    "write_file": lambda p: {"path": p, "content": "x" * 300},
    "edit_file": lambda p: {"path": p, "edits": [{"target": "a" * 300, "replacement": "b"}]},
    "apply_patch": lambda p: {"patch": f"LP1\nF {p}\nT\nline\n.\nEND\n"},
    "delete_file": lambda p: {"path": p, "recursive": True},
    "move_file": lambda p: {"source": p, "destination": p + "-moved" + "x" * 200},
    "shell_jobs": lambda p: {"action": "output", "job_id": "job_1"},
    "web_fetch": lambda p: {"url": f"https://example.com/{p}?q={'x' * 300}", "method": "POST", "body": "x" * 300},
    "web_search": lambda p: {"query": p + "x" * 300},
    "memory": lambda p: {"action": "set", "key": p + "k" * 300, "value": "v"},
    "write_todos": lambda p: {"action": "add", "task": p + "t" * 300},
    "restore_files": lambda p: {
        "undoes": "b" * 200,
        "entries": [{"path": p, "expect_kind": "file", "kind": "absent"}],
    },
}
WITHOUT_LOCATIONS = {"run_code", "shell_jobs", "web_search", "memory", "write_todos"}


@given(paths)
def test_properties_45_46_summary_and_locations(path: str) -> None:
    import msgspec

    for tool in builtin_tools():
        args = msgspec.convert(EXAMPLES[tool.name](path), tool.args_type)
        summary = tool.summary(args)
        assert summary and len(summary) <= 200
        if tool.name == "web_fetch":  # its location is the URL as shown to people
            assert [f"https://example.com/{path}?q={'x' * 300}"] == tool.locations(args)
        elif tool.name not in WITHOUT_LOCATIONS:
            assert path in tool.locations(args)


def test_property_47_read_only_tools_need_no_confirmation_and_side_effects_ask() -> None:
    me = Identity(uid=1000, gid=1000, pid=1)

    def decide(tool: str, side_effecting: bool, approval: ApprovalConfig) -> str:
        facts = policy.Facts(tool=tool, arguments={}, side_effecting=side_effecting)
        return policy.evaluate(facts, me, "", approval).decision

    approval = ApprovalConfig()
    for tool in builtin_tools():
        expected = "ask" if tool.side_effecting else "allow"
        assert decide(tool.name, tool.side_effecting, approval) == expected
    assert decide("write_file", True, approval) == "ask"
    assert decide("write_file", True, ApprovalConfig(allowlist=["write_file"])) == "allow"
    assert decide("grep", False, ApprovalConfig(denylist=["grep"])) == "deny"
    assert decide("grep", False, ApprovalConfig(mode="deny")) == "deny"
    assert decide("write_file", True, ApprovalConfig(mode="auto")) == "allow"
