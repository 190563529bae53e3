"""``toolctl``: talk to a running toold from a shell. The only module that prints.

Exit codes: 0 success, 1 a tool result was an error, 2 usage or connection error.
``TOOLD_ENDPOINT`` stands for ``--endpoint``, ``TOOLD_WORKSPACE`` for ``--workspace``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import msgspec

from toold_protocol import ConfirmationRequested, ToolResult, default_endpoint, sanitize_for_terminal

from . import _journal_cli, _notes_cli, _stats_cli
from ._client import APPROVE_ALL, Client, ConfirmHandler, Decision
from ._errors import DaemonUnavailable, Refused, TooldError
from ._live import Live
from ._requests import CallSpec
from ._result_json import result_json

EXIT_OK, EXIT_TOOL_ERROR, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolctl", description="Command-line client of the toold daemon")
    parser.add_argument("--version", action=_PrintVersion, help="print the version and exit")
    parser.add_argument(
        "--endpoint", default=None, help="daemon endpoint (default: $TOOLD_ENDPOINT or the per-user socket)"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a reply")
    parser.add_argument(
        "--workspace",
        default=os.environ.get("TOOLD_WORKSPACE") or None,
        metavar="DIR",
        help="the directory this session works in (default: $TOOLD_WORKSPACE, else the daemon's roots)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    completion = sub.add_parser("completion", help="print a shell completion script (bash, zsh or fish)")
    completion.add_argument("shell", choices=["bash", "zsh", "fish"])

    ping = sub.add_parser("ping", help="check that the daemon answers")
    ping.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep trying for up to SECONDS until the daemon answers",
    )

    call = sub.add_parser("call", help="run one tool call")
    call.add_argument("name")
    call.add_argument("--args", default="{}", help="arguments as a JSON object")
    call.add_argument("--json", action="store_true", help="print the result as one JSON object")
    call.add_argument("--dry-run", action="store_true", help="show what it would do (diffs, policy); change nothing")
    _confirmation_flags(call)

    batch = sub.add_parser("batch", help="run a batch: a JSON array of {id, name, arguments}")
    batch.add_argument("file", nargs="?", default="-", help="file with the batch (default: stdin)")
    batch.add_argument("--json", action="store_true", help="print the results as a JSON array")
    batch.add_argument("--batch-id", default=None, help="choose the batch id")
    batch.add_argument("--dry-run", action="store_true", help="show what it would do (diffs, policy); change nothing")
    _confirmation_flags(batch)
    undo = sub.add_parser("undo", help="put back every file a finished batch changed")
    undo.add_argument("batch_id")
    undo.add_argument("--force", action="store_true", help="restore even paths that changed since the batch")
    undo.add_argument("--json", action="store_true", help="print the result as one JSON object")
    pending = sub.add_parser("pending", help="confirmation requests you may answer")
    pending.add_argument("--json", action="store_true")
    approve = sub.add_parser("approve", help="approve a confirmation request")
    approve.add_argument("request_id")
    approve.add_argument("--calls", default="", help="approve only these call ids (comma-separated)")
    approve.add_argument("--remember", action="store_true", help="allow the same again for that session")
    approve.add_argument(
        "--always", action="store_true", help="a command's network host: allow it in that workspace from now on"
    )
    deny = sub.add_parser("deny", help="deny a confirmation request")
    deny.add_argument("request_id")
    deny.add_argument("--reason", default="")

    recover = sub.add_parser("recover", help="resume or discard a batch interrupted by a daemon restart")
    recover.add_argument("batch_id")
    action = recover.add_mutually_exclusive_group(required=True)
    action.add_argument("--resume", action="store_true", help="run the calls that never started")
    action.add_argument("--discard", action="store_true", help="fail the calls that never started")
    recover.add_argument("--json", action="store_true")

    sub.add_parser("watch", help="terminal view for approvers: live batches, approvals, output")
    supplied = sub.add_parser("result", help="parse-only mode: supply the result of a pending call")
    supplied.add_argument("call_id")
    supplied.add_argument("--batch", required=True, help="the batch the call belongs to")
    supplied.add_argument("--content", required=True, help="the result text ('-' reads stdin)")
    supplied.add_argument("--error", action="store_true", help="supply an error result")

    policy = sub.add_parser("policy", help="ask the daemon's policy")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    explain = policy_sub.add_parser("explain", help="the decision for a call, and the rule that made it")
    explain.add_argument("name")
    explain.add_argument("--args", default="{}", help="arguments as a JSON object")
    explain.add_argument("--json", action="store_true")
    policy_sub.add_parser("reload", help="reread the policy from the daemon's config file")

    _journal_cli.add_parser(sub)
    _notes_cli.add_parsers(sub)
    _stats_cli.add_parser(sub)
    mcp = sub.add_parser("mcp", help="serve the daemon's tools to an MCP client over stdio")
    mcp.add_argument(
        "--workspace", dest="mcp_workspace", metavar="DIR", help="the session's workspace (default: the client's roots)"
    )
    mcp.add_argument(
        "--approval-timeout", type=float, default=None, help="seconds an approval may take (default: the daemon's)"
    )
    tools = sub.add_parser("tools", help="list the daemon's tools")
    tools.add_argument("--format", default="text", choices=["text", "json", "openai", "anthropic", "gemini"])
    return parser


def _mcp(endpoint: str | None, workspace: str | None, approval_timeout: float | None) -> int:
    try:
        from . import mcp_stdio
    except ImportError as exc:
        hint = "pip install 'toold-client[mcp]'"
        print(f"toolctl mcp needs the MCP SDK ({exc.name} is missing): {hint}", file=sys.stderr)
        return EXIT_USAGE
    return mcp_stdio.main(endpoint, workspace, approval_timeout)


def main(argv: list[str] | None = None) -> int:
    """Run toolctl; a reader that closed the pipe (``toolctl memory list | head``) ends it
    quietly, with the status a shell reports for SIGPIPE, as Unix tools end."""
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail again
        return EXIT_BROKEN_PIPE


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    _complete(parser)
    args = parser.parse_args(argv)
    if args.command == "completion":
        print(_completion_script(["toolctl"], shell=args.shell))
        return EXIT_OK
    endpoint = args.endpoint or default_endpoint()
    try:
        if args.command == "ping":
            return _ping(endpoint, args.wait, args.timeout)
        if args.command == "mcp":
            return _mcp(args.endpoint, args.mcp_workspace or args.workspace, args.approval_timeout)
        with Client(endpoint, client_name="toolctl", timeout=args.timeout, workspace=args.workspace) as client:
            if args.command == "call":
                return _call(client, args, _confirm_handler(args))
            if args.command == "batch":
                return _batch(client, args, _confirm_handler(args))
            if args.command == "pending":
                return _pending(client, args.json)
            if args.command in ("approve", "deny"):
                return _answer(client, args)
            if args.command == "policy":
                return _policy(client, args)
            if args.command == "watch":
                from .watch import run as watch

                return watch(client)
            if args.command == "result":
                content = sys.stdin.read() if args.content == "-" else args.content
                client.supply_result(args.batch, args.call_id, content, ok=not args.error)
                print(f"result supplied for {sanitize_for_terminal(args.call_id)}")
                return EXIT_OK
            if args.command == "journal":
                return _journal_cli.run(client, args)
            if args.command in ("memory", "todos"):
                return _notes_cli.run(client, args, _leave_to_approver)
            if args.command == "undo":
                return _undo(client, args)
            if args.command == "stats":
                return _stats_cli.run(client, args)
            if args.command == "recover":
                return _recover(client, args.batch_id, "resume" if args.resume else "discard", args.json)
            return _tools(client, args.format)
    except _UsageError as exc:
        print(f"toolctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TooldError as exc:
        print(f"toolctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        # A person's Ctrl-C: a message and the shell's exit code, not a traceback. A batch
        # already submitted is left to the daemon (`toolctl journal list` shows it).
        print("toolctl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


EXIT_INTERRUPTED = 130  # as a shell reports SIGINT
EXIT_BROKEN_PIPE = 141  # as a shell reports SIGPIPE


def _version() -> str:
    import importlib.metadata  # here: the lookup costs every other command ~15 ms

    try:
        return importlib.metadata.version("toold-client")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class _PrintVersion(argparse.Action):
    """``--version``, looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"toolctl {_version()}")  # on stdout, as argparse's own version action does
        parser.exit()


class _UsageError(Exception):
    pass


def _ping(endpoint: str, wait: float, timeout: float) -> int:
    deadline = time.monotonic() + wait
    while True:
        try:
            with Client(endpoint, client_name="toolctl", timeout=min(timeout, max(wait, 1.0))) as client:
                rtt = client.ping(timeout=min(1.0, timeout) if wait else timeout)
            print(f"pong from {endpoint} in {rtt * 1000:.2f} ms")
            return EXIT_OK
        except Refused as exc:  # for good: waiting changes nothing
            print(f"toolctl: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except DaemonUnavailable as exc:
            if time.monotonic() >= deadline:
                print(f"toolctl: {exc}", file=sys.stderr)
                return EXIT_USAGE
            time.sleep(0.05)


def _parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _UsageError(f"{what} is not valid JSON: {exc}") from None


def _confirmation_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--yes", action="store_true", help="approve this command's own confirmation requests")
    group.add_argument("--no", action="store_true", help="deny this command's own confirmation requests")
    parser.add_argument(
        "--approval-timeout", type=float, default=None, metavar="SECONDS", help="how long to wait for an approver"
    )


def _confirm_handler(args: argparse.Namespace) -> ConfirmHandler:
    """--yes approves, --no denies; otherwise ask on a terminal, or (no terminal) leave the
    request to an approver (toolctl approve / watch) until the daemon's timeout."""
    if args.yes:
        return lambda request: APPROVE_ALL
    if args.no:
        return lambda request: Decision("deny_all", reason="denied with toolctl --no")
    if sys.stdin.isatty() and sys.stderr.isatty():
        return _prompt
    return _leave_to_approver


def _leave_to_approver(request: ConfirmationRequested) -> None:
    print(
        f"toolctl: waiting for approval of {request.correlation_id} "
        f"(toolctl approve {request.correlation_id}); {request.expires_in_ms // 1000}s left",
        file=sys.stderr,
    )


def _prompt(request: ConfirmationRequested) -> Decision:
    _describe(request, sys.stderr)
    answer = input("approve? [y]es all / [n]o / comma-separated call ids: ").strip()
    if answer.lower() in ("y", "yes"):
        return APPROVE_ALL
    if not answer or answer.lower() in ("n", "no"):
        return Decision("deny_all", reason="denied at the terminal")
    return Decision("approve_selected", approved_call_ids=tuple(c.strip() for c in answer.split(",") if c.strip()))


def _describe(request: ConfirmationRequested, out: Any) -> None:
    print(f"confirmation {request.correlation_id} for batch {sanitize_for_terminal(request.batch_id)}:", file=out)
    for item in request.calls:
        print(f"  [{item.risk}] {sanitize_for_terminal(item.call_id)}: {sanitize_for_terminal(item.summary)}", file=out)
        for reason in item.reasons:
            print(f"      {sanitize_for_terminal(reason)}", file=out)


def _pending(client: Client, as_json: bool) -> int:
    requests = client.subscribe()
    if as_json:
        rows = [
            {
                "request_id": r.correlation_id,
                "batch_id": r.batch_id,
                "expires_in_ms": r.expires_in_ms,
                "calls": [
                    {"call_id": c.call_id, "tool": c.name, "summary": c.summary, "risk": c.risk, "reasons": c.reasons}
                    for c in r.calls
                ],
            }
            for r in requests
        ]
        print(json.dumps(rows, ensure_ascii=False))
    else:
        for request in requests:
            _describe(request, sys.stdout)
        if not requests:
            print("no pending confirmation requests")
    return EXIT_OK


def _policy(client: Client, args: argparse.Namespace) -> int:
    if args.policy_command == "reload":
        client.reload_policy()
        print("policy reloaded")
        return EXIT_OK
    arguments = _parse_json(args.args, "--args")
    if not isinstance(arguments, dict):
        raise _UsageError("--args must be a JSON object")
    answer = client.explain(args.name, arguments)
    if args.json:
        row = {"tool": answer.tool, "decision": answer.decision, "reason": answer.reason}
        print(json.dumps(row | {"risk": answer.risk, "rule": answer.rule}, ensure_ascii=False))
    else:
        rule = f" (rule {answer.rule})" if answer.rule is not None else ""
        print(f"{answer.decision}{rule}: {sanitize_for_terminal(answer.reason)} [risk {answer.risk}]")
    return EXIT_OK


def _answer(client: Client, args: argparse.Namespace) -> int:
    client.subscribe()  # an approver session may answer its uid's (or its group's) requests
    if args.command == "deny":
        decision = Decision("deny_all", reason=args.reason or "denied with toolctl deny")
    elif args.calls:
        ids = tuple(c.strip() for c in args.calls.split(",") if c.strip())
        decision = Decision(
            "approve_selected",
            approved_call_ids=ids,
            remember_for_session=args.remember,
            remember_for_workspace=args.always,
        )
    else:
        decision = Decision("approve_all", remember_for_session=args.remember, remember_for_workspace=args.always)
    client.confirm(args.request_id, decision)
    print(f"{'denied' if args.command == 'deny' else 'approved'} {sanitize_for_terminal(args.request_id)}")
    return EXIT_OK


def _call(client: Client, args: argparse.Namespace, on_confirm: ConfirmHandler) -> int:
    arguments = _parse_json(args.args, "--args")
    if not isinstance(arguments, dict):
        raise _UsageError("--args must be a JSON object")
    if args.dry_run:
        outcome = client.submit([CallSpec(args.name, arguments)], events="results", dry_run=True)
        result = outcome.results[0]
        streamed: set[str] = set()
    else:
        with _live(args) as live:
            outcome = client.submit(
                [CallSpec(args.name, arguments)],
                events="all" if live is not None else "results",
                on_event=live,
                on_confirm=on_confirm,
                approval_timeout=args.approval_timeout,
            )
        result = outcome.results[0]
        streamed = live.streamed if live is not None else set()
    if args.json:
        print(json.dumps(result_json(result), ensure_ascii=False))
    else:
        _print_result(result, streamed=result.call_id in streamed)
    return EXIT_OK if result.ok else EXIT_TOOL_ERROR


def _batch(client: Client, args: argparse.Namespace, on_confirm: ConfirmHandler) -> int:
    text = sys.stdin.read() if args.file == "-" else _read(args.file)
    calls = _parse_json(text, "the batch")
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise _UsageError("the batch must be a JSON array of objects {id, name, arguments}")
    with _live(args) as live:
        outcome = client.submit(
            calls,
            batch_id=args.batch_id,
            events="all" if live is not None else "results",
            on_event=live,
            on_confirm=on_confirm,
            approval_timeout=args.approval_timeout,
            dry_run=args.dry_run,
        )
    streamed = live.streamed if live is not None else set()
    if args.json:
        print(json.dumps([result_json(r) for r in outcome.results], ensure_ascii=False))
    else:
        for result in outcome.results:
            print(f"=== {sanitize_for_terminal(result.call_id)} ({'ok' if result.ok else 'error'})")
            _print_result(result, streamed=result.call_id in streamed)
    return EXIT_OK if all(r.ok for r in outcome.results) else EXIT_TOOL_ERROR


def _undo(client: Client, args: argparse.Namespace) -> int:
    """Undo a batch; this command approves its own undo when the policy asks (running it
    is the person's decision), and exits 1 when a path changed since stops it."""
    outcome = client.undo(args.batch_id, force=args.force, on_confirm=lambda request: APPROVE_ALL)
    result = outcome.results[0]
    if args.json:
        print(json.dumps({"batch_id": outcome.batch_id, **result_json(result)}, ensure_ascii=False))
    else:
        if result.ok:
            print(f"undo batch {sanitize_for_terminal(outcome.batch_id)} (toolctl undo it to redo)")
        _print_result(result)
    return EXIT_OK if result.ok else EXIT_TOOL_ERROR


def _recover(client: Client, batch_id: str, action: str, as_json: bool) -> int:
    finished = client.recover(batch_id, "resume" if action == "resume" else "discard")
    if finished is None:
        print(f"discarded the pending calls of {sanitize_for_terminal(batch_id)}")
        return EXIT_OK
    if as_json:
        print(json.dumps([result_json(r) for r in finished.results], ensure_ascii=False))
    else:
        print(f"batch {sanitize_for_terminal(batch_id)}: {finished.state}")
    return EXIT_OK if all(r.ok for r in finished.results) else EXIT_TOOL_ERROR


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise _UsageError(f"cannot read {path}: {exc.strerror}") from None


def _tools(client: Client, fmt: str) -> int:
    if fmt == "text":
        for tool in client.tools():
            assert not isinstance(tool, dict)
            print(f"{tool.name:<18} {tool.risk:<6} {tool.description.splitlines()[0]}")
        return EXIT_OK
    listing = client.tools("toold" if fmt == "json" else fmt)
    print(json.dumps(msgspec.to_builtins(listing), indent=2, ensure_ascii=False))
    return EXIT_OK


@contextlib.contextmanager
def _live(args: argparse.Namespace) -> Iterator[Live | None]:
    """Output as it comes and a progress line, when a person watches a terminal (not
    with ``--json``, ``--dry-run`` or a pipe: those get exactly the results, once)."""
    if args.json or getattr(args, "dry_run", False) or not sys.stdout.isatty():
        yield None
        return
    with Live(sys.stdout, sys.stderr) as live:
        yield live


def _print_result(result: ToolResult, *, streamed: bool = False) -> None:
    """Content for pipes (exact bytes), sanitized when stdout is a terminal; after output
    streamed live, only what it did not show (the error line, the exit code)."""
    text = result.content
    if streamed:
        text = _after_streaming(result)
    if sys.stdout.isatty():
        text = sanitize_for_terminal(text)
    stream = sys.stdout if result.ok else sys.stderr
    stream.write(text if text.endswith("\n") or not text else text + "\n")


def _after_streaming(result: ToolResult) -> str:
    """What a streamed call's result adds to the output already shown."""
    if result.error is not None:
        return f"Error ({result.error.type}): {result.error.message}"
    code = (result.data or {}).get("exit_code")
    return f"[exit code {code}]" if code is not None else ""


def _complete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request, if this run is one (argcomplete, imported
    only then: it costs start-up time otherwise)."""
    if "_ARGCOMPLETE" in os.environ:
        import argcomplete

        argcomplete.autocomplete(parser)


def _completion_script(programs: list[str], shell: str) -> str:
    from argcomplete import shell_integration

    return shell_integration.shellcode(programs, shell=shell)
