"""Config files as the tests write them: TOML sections from dicts."""

from __future__ import annotations

from pathlib import Path


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def write_toml(path: Path, base: dict[str, dict[str, object]],
               **sections: dict[str, object]) -> Path:
    """``base`` with ``sections`` laid over it (field by field) as a TOML file at ``path``."""
    merged = {name: dict(values) for name, values in base.items()}
    for name, values in sections.items():
        merged.setdefault(name, {}).update(values)
    lines = []
    for name, values in merged.items():
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {_value(value)}" for key, value in values.items())
    path.write_text("\n".join(lines) + "\n")
    return path
