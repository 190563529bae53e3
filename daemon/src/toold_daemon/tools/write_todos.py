"""write_todos: a todo list per user and workspace, kept by the daemon across sessions.

Two shapes: the step-by-step actions (``add``, ``complete``, ``remove``, ``list``) and
the whole-list ``replace`` with statuses that today's coding agents are trained to send.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from toold_protocol import ToolErrorType

from ..config import Config
from ..errors import ToolError, bad_args, limits_exceeded
from ..records.user_state import Full, Todo, UnknownTodo
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._data import WriteTodosData
from .memory import _store, scope_of

Status = Literal["pending", "in_progress", "completed", "cancelled"]
MARKS = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]", "cancelled": "[-]"}


class TodoItem(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    task: Annotated[str, Meta(min_length=1, description="What to do")]
    status: Annotated[Status, Meta(description="pending, in_progress, completed or cancelled")] = "pending"


class WriteTodosArgs(ToolArgs, frozen=True):
    """Keep a todo list."""

    action: Annotated[
        Literal["add", "complete", "remove", "list", "replace"],
        Meta(description="add (task), complete (id), remove (id), list, or replace (todos: the whole list)"),
    ]
    task: Annotated[str, Meta(description="The task to add")] = ""
    id: Annotated[str, Meta(max_length=32, description="The todo (complete, remove)")] = ""
    todos: Annotated[list[TodoItem], Meta(max_length=1000, description="The whole list (replace)")] = []  # noqa: RUF012


class WriteTodos(Tool[WriteTodosArgs]):
    name = "write_todos"
    description = (
        "Keep a todo list for this workspace: add a task (returns its id), complete or remove one by id, "
        "list them, or replace the whole list with todos=[{task, status}] (status pending, in_progress, "
        "completed or cancelled; at most one in_progress)."
    )
    args_type = WriteTodosArgs
    side_effecting = True
    in_daemon = True
    data_type = WriteTodosData
    output = "data: {todos: [{id, task, status, created}]} (oldest first), and {id} for add"

    def validate(self, args: WriteTodosArgs) -> None:
        if args.action == "add" and not args.task.strip():
            raise bad_args("action 'add' needs a task")
        if args.action in ("complete", "remove") and not args.id:
            raise bad_args(f"action {args.action!r} needs an id")
        if args.action == "replace" and sum(t.status == "in_progress" for t in args.todos) > 1:
            raise bad_args("at most one todo may be in_progress")

    def summary(self, args: WriteTodosArgs) -> str:
        detail = {"add": args.task[:120], "complete": args.id, "remove": args.id}.get(args.action, "")
        if args.action == "replace":
            detail = f"{len(args.todos)} todos"
        return f"Todos: {args.action} {detail}".strip()

    def prompts(self, args: WriteTodosArgs, resolved: dict[str, Path], config: Config) -> bool:
        return False

    def run(self, args: WriteTodosArgs, ctx: ToolContext) -> ToolOutput:
        state, uid, scope = _store(ctx), ctx.identity.uid, scope_of("workspace", ctx)
        limits = ctx.config.tools.todos
        tasks = [args.task] if args.action == "add" else [t.task for t in args.todos]
        if any(len(task) > limits.max_task_chars for task in tasks):
            raise limits_exceeded(f"a task is longer than max_task_chars = {limits.max_task_chars}")
        extra: dict[str, str] = {}
        try:
            if args.action == "add":
                added = state.add_todo(
                    uid, scope, args.task.strip(), max_todos=limits.max_todos, max_per_user=limits.max_todos_per_user
                )
                extra["id"] = added.id
            elif args.action == "complete":
                state.set_status(uid, scope, args.id, "completed")
            elif args.action == "remove":
                state.remove_todo(uid, scope, args.id)
            elif args.action == "replace":
                items: list[tuple[str, str]] = [(t.task, t.status) for t in args.todos]
                state.replace_todos(
                    uid, scope, items, max_todos=limits.max_todos, max_per_user=limits.max_todos_per_user
                )
        except Full as exc:
            raise limits_exceeded(str(exc)) from None
        except UnknownTodo:
            raise ToolError(
                ToolErrorType.BAD_ARGS, "UNKNOWN_TODO", f"no todo with id {args.id!r}", id=args.id
            ) from None
        todos = state.todos(uid, scope)
        head = f"added {extra['id']}\n" if "id" in extra else ""
        return ToolOutput(head + render(todos), data={"todos": [_as_dict(t) for t in todos], **extra})


def render(todos: list[Todo]) -> str:
    return "\n".join(f"{MARKS.get(t.status, '[?]')} {t.id}: {t.task}" for t in todos) or "no todos"


def _as_dict(todo: Todo) -> dict[str, object]:
    return {"id": todo.id, "task": todo.task, "status": todo.status, "created": todo.created}
