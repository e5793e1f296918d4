"""Where the configs that ship with Conveyor are, installed or in a checkout.

The source tree's ``configs/`` directory is installed with the package as
``conveyor/configs/`` (pyproject's package-dir), so a user who installed Conveyor with
pip has the files the documentation names; ``conveyor configs`` lists and copies them,
and the throughput benchmarks run them as shipped.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2]
"""The ``conveyor`` package directory."""


def shipped_configs_dir() -> Path:
    """``conveyor/configs/`` when installed from a wheel, the source tree's ``configs/``
    when run from a checkout (or an editable install)."""
    installed = PACKAGE / "configs"
    return installed if installed.is_dir() else PACKAGE.parent / "configs"


def shipped_configs() -> dict[str, Path]:
    """Name (``redis``) -> file of every shipped config, sorted by name."""
    return {p.stem: p for p in sorted(shipped_configs_dir().glob("*.toml"))}
