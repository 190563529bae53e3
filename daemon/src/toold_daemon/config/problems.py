"""Every problem in a configuration, not only the first.

msgspec stops at the first value it cannot take. To report them all, a document that
failed is walked against its types: each field of a Struct and each element of a list
of Structs is converted on its own, so a wrong value in ``[daemon]`` does not hide an
unknown key in ``[tools.sandbox]`` or a bad decision in the third policy rule. Where no
part alone is wrong, the whole is (a required field missing, or a check across fields
in ``__post_init__``), and that is the problem reported there.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Union

import msgspec

_AT = re.compile(r" - at `\$([^`]*)`$")


def problems(value: Any, kind: Any, path: str = "") -> list[tuple[str, str]]:
    """(path, message) of each value in ``value`` that ``kind`` refuses; [] if it takes all.
    Paths are msgspec's (``$.tools.approval.rules[2].decision``)."""
    try:
        msgspec.convert(value, kind)
        return []
    except msgspec.ValidationError as exc:
        whole = _located(str(exc), path)
    struct = _struct_in(kind)
    found: list[tuple[str, str]] = []
    if struct is not None and isinstance(value, dict):
        fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
        forbids = struct.__struct_config__.forbid_unknown_fields
        for key, item in value.items():
            field = fields.get(key)
            if field is None:
                if forbids:
                    found.append((path or "$", f"Object contains unknown field `{key}`"))
                continue
            found += problems(item, field.type, f"{path or '$'}.{key}")
    elif isinstance(value, list) and (element := _element_of(kind)) is not None and _struct_in(element) is not None:
        for index, item in enumerate(value):
            found += problems(item, element, f"{path or '$'}[{index}]")
    return found or [whole]


def _located(message: str, path: str) -> tuple[str, str]:
    """msgspec's message split into (the full path, the message without its path)."""
    match = _AT.search(message)
    inner = match.group(1) if match else ""
    return (path or "$") + inner, message[: match.start()] if match else message


def _struct_in(kind: Any) -> type[msgspec.Struct] | None:
    """The Struct type in ``kind`` (itself, or inside Annotated or an optional union)."""
    kind = _unannotated(kind)
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return kind
    found: type[msgspec.Struct] | None = _the_one_in_union(kind, _struct_in)
    return found


def _element_of(kind: Any) -> Any:
    """The element type of a list in ``kind`` (itself, or inside an optional union)."""
    kind = _unannotated(kind)
    if typing.get_origin(kind) is list:
        (element,) = typing.get_args(kind)
        return element
    return _the_one_in_union(kind, _element_of)


def _the_one_in_union(kind: Any, find: Any) -> Any:
    """What ``find`` finds in exactly one member of the union ``kind`` (else None)."""
    if typing.get_origin(kind) not in (Union, types.UnionType):
        return None
    found = [f for f in map(find, typing.get_args(kind)) if f is not None]
    return found[0] if len(found) == 1 else None


def _unannotated(kind: Any) -> Any:
    while typing.get_origin(kind) is typing.Annotated:
        kind = typing.get_args(kind)[0]
    return kind
