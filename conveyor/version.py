"""Conveyor's version: the installed distribution's, else the source tree's pyproject.toml."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "conveyor"
UNKNOWN = "0+unknown"


def version() -> str:
    """The version ``pip`` installed; from a source tree that was never installed, the one
    in its ``pyproject.toml``; ``0+unknown`` if neither can be read."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return pyproject_version(Path(__file__).resolve().parent.parent / "pyproject.toml")


def pyproject_version(path: Path) -> str:
    """``[project] version`` of the ``pyproject.toml`` at ``path``, or ``0+unknown``."""
    try:
        with path.open("rb") as fh:
            return str(tomllib.load(fh)["project"]["version"])
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError):
        return UNKNOWN
