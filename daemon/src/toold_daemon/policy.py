"""The approval decision for one call: pure, no I/O.

This is the seed 003 policy block (``[tools.approval]``) in its simplest form: disabled
approval → everything allowed; denylist → deny; allowlist → allow; ``mode``
``deny``/``auto``; otherwise side-effecting tools ask and read-only tools run. Rules,
identities and confirmations arrive with the policy issue; until then ``ask`` is
pre-resolved as denied with a message saying how to allow the tool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .config import ApprovalConfig

Decision = Literal["allow", "deny", "ask"]


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    reason: str


def decide(tool_name: str, side_effecting: bool, approval: ApprovalConfig) -> Verdict:
    if tool_name in approval.denylist:
        return Verdict("deny", f"{tool_name} is on the approval denylist")
    if not approval.enabled or tool_name in approval.allowlist:
        return Verdict("allow", "allowlisted" if approval.enabled else "approval disabled")
    if approval.mode == "deny":
        return Verdict("deny", "approval mode is 'deny' and the tool is not allowlisted")
    if approval.mode == "auto" or not side_effecting or not approval.prompt_side_effects:
        return Verdict("allow", "read-only" if not side_effecting else "approval mode is 'auto'")
    return Verdict("ask", f"{tool_name} has side effects and needs confirmation")
