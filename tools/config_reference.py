"""The configuration reference page, generated from the config schema itself.

Every section of :class:`conveyor.Config` is a msgspec Struct in
``conveyor/platform/config/__init__.py``; each field's type, default and bounds come from
``msgspec.inspect``, and its meaning from the docstring written under it (read with
``ast``, since Python keeps no attribute docstrings at run time). The docs site builds
this page on every build (``tools/mkdocs_hooks.py``), so it cannot drift from the code.

``python -m tools.config_reference`` prints the page.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from conveyor.platform import config as config_module

PAGE = "configuration-reference.md"


@dataclass(frozen=True)
class Field:
    path: str  # "slots.resource.min_slots"
    type: str
    default: str
    doc: str


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each annotated field of a class's own body."""
    [node] = ast.parse(inspect.getsource(cls)).body
    assert isinstance(node, ast.ClassDef)
    docs: dict[str, str] = {}
    for here, after in itertools.pairwise(node.body):
        if (isinstance(here, ast.AnnAssign) and isinstance(here.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[here.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _number(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and not math.isinf(value):
        return f"{int(value):_}".replace("_", ",") if abs(value) >= 10_000 else str(value)
    return f"{value:_}".replace("_", ",") if isinstance(value, int) else str(value)


def _bounds(t: Any) -> str:
    lower = [f"≥ {_number(t.ge)}"] if getattr(t, "ge", None) is not None else []
    lower += [f"> {_number(t.gt)}"] if getattr(t, "gt", None) is not None else []
    upper = [f"≤ {_number(t.le)}"] if getattr(t, "le", None) is not None else []
    upper += [f"< {_number(t.lt)}"] if getattr(t, "lt", None) is not None else []
    return ", ".join(lower + upper)


def type_name(t: msgspec.inspect.Type) -> str:
    """A TOML-minded name for a field's type: ``int (≥ 1)``, ``"a" | "b"``, ``list of int``."""
    mi = msgspec.inspect
    if isinstance(t, mi.UnionType):
        members = [m for m in t.types if not isinstance(m, mi.NoneType)]
        name = " | ".join(type_name(m) for m in members)
        return f"{name}, optional" if len(members) < len(t.types) else name
    if isinstance(t, mi.LiteralType):
        return " \\| ".join(f'`"{v}"`' if isinstance(v, str) else f"`{v}`" for v in t.values)
    if isinstance(t, mi.ListType):
        return f"list of {type_name(t.item_type)}"
    if isinstance(t, mi.DictType):
        return f"table of {type_name(t.value_type)}"
    if isinstance(t, mi.AnyType):
        return "any"
    names = {mi.IntType: "integer", mi.FloatType: "number", mi.StrType: "string",
             mi.BoolType: "boolean"}
    name = names.get(type(t), type(t).__name__.removesuffix("Type").lower())
    bounds = _bounds(t)
    return f"{name} ({bounds})" if bounds else name


def default_text(value: Any) -> str:
    """A default as it would be written in the TOML file (``unset``: no value)."""
    if value is msgspec.NODEFAULT or value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, (list, dict)):
        return f"`{msgspec.json.encode(value).decode()}`"
    return f"`{value}`"  # as TOML writes it: 1024, 0.05


def _default(f: msgspec.inspect.Field) -> Any:
    if f.default_factory is not msgspec.NODEFAULT:
        return f.default_factory()
    return f.default


def sections() -> Iterator[tuple[str, type, list[Field]]]:
    """``(section path, its Struct, its plain fields)``, in the order of ``Config``."""
    def walk(path: str, cls: type) -> Iterator[tuple[str, type, list[Field]]]:
        info = msgspec.inspect.type_info(cls)
        assert isinstance(info, msgspec.inspect.StructType)
        docs = field_docs(cls)
        plain: list[Field] = []
        nested: list[tuple[str, type]] = []
        for f in info.fields:
            if isinstance(f.type, msgspec.inspect.StructType):
                nested.append((f"{path}.{f.name}" if path else f.name, f.type.cls))
            else:
                plain.append(Field(f"{path}.{f.name}", type_name(f.type),
                                   default_text(_default(f)), docs.get(f.name, "")))
        if path:
            yield path, cls, plain
        for sub_path, sub in nested:
            yield from walk(sub_path, sub)

    yield from walk("", config_module.Config)


def all_field_paths() -> list[str]:
    return [f.path for _, _, fields in sections() for f in fields]


def _cell(text: str) -> str:
    """One Markdown table cell: reST-style double backquotes to Markdown, pipes escaped."""
    text = " ".join(text.split()).replace("``", "`")
    text = text.replace(":class:`~conveyor.Client`", "`Client`")
    return text.replace("|", "\\|") if "`" not in text else _escape_outside_code(text)


def _escape_outside_code(text: str) -> str:
    parts = text.split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated at build time from conveyor/platform/config/__init__.py "
        "(tools/config_reference.py): edit the docstrings there, not this page. -->",
        "",
        "Every setting, section by section, as the code declares it: the type and bounds "
        "a value must meet, its default, and what it does. How files, `CONVEYOR_*` "
        "variables and flags combine is in [Configuration](configuration.md).",
        "",
        "Each field is set in its TOML section, or by the environment variable that names "
        "its path with double underscores (`[slots.resource] min_slots` is "
        "`CONVEYOR_SLOTS__RESOURCE__MIN_SLOTS`); a `*_s` or `*_ms` field is a duration "
        "in seconds or milliseconds.",
        "",
    ]
    for path, cls, fields in sections():
        doc = inspect.cleandoc(cls.__doc__ or "")
        about = _cell(doc.split(": ", 1)[-1]) if doc else ""
        lines += [f"## `[{path}]`", "", about[:1].upper() + about[1:], ""]
        if not fields:
            continue
        lines += ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
        for f in fields:
            name = f.path.rsplit(".", 1)[1]
            lines.append(f'| <a id="{f.path}"></a>`{name}` | {f.type} | {f.default} | '
                         f"{_cell(f.doc)} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render())
