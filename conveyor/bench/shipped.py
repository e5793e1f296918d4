"""The configs the throughput benchmarks run: the files in ``configs/`` as they ship.

A benchmark of an adapter loads the file a user of that adapter starts from (memory:
``local.toml``, redis: ``redis.toml``, kafka: ``kafka.toml``) and changes only where it
runs — the server address and a private key prefix, topic or in-process broker name —
so its figure is what a user running that file gets. A :class:`Variant`
(``--slots N``, ``--set section.field=value``) changes more, and is named in every
figure's output (``variant``). ``CONVEYOR_*`` environment variables are ignored here,
and stripped from the environment of the worker processes a benchmark starts: a shell
that happens to set ``CONVEYOR_SLOTS__COUNT`` must not turn the shipped run into another.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from conveyor.bench import BenchmarkError
from conveyor.platform.config import (
    Config,
    decode_config_file,
    parse_config,
    read_config_file,
)
from conveyor.platform.config.shipped import shipped_configs_dir
from conveyor.platform.errors import ConfigError

SHIPPED_FILES = {"memory": "local.toml", "redis": "redis.toml", "kafka": "kafka.toml"}


def shipped_path(adapter: str) -> Path:
    """The shipped ``<file>`` for ``adapter`` (:mod:`conveyor.platform.config.shipped`:
    installed with the package, or a checkout's ``configs/``)."""
    path = shipped_configs_dir() / SHIPPED_FILES[adapter]
    if not path.is_file():
        raise BenchmarkError(
            f"the shipped config {path} is not there (an install without its configs?); "
            "pass --config FILE"
        )
    return path


def parse_setting(text: str) -> tuple[str, Any]:
    """``section.field=value`` -> (``section.field``, value); the value is read as TOML
    (``1024``, ``true``, ``"fixed"``), or taken as a string when it is not TOML."""
    path, sep, raw = text.partition("=")
    parts = path.strip().split(".")
    if not sep or len(parts) < 2 or not all(parts):
        raise BenchmarkError(f"{text!r} is not SECTION.FIELD=VALUE (e.g. slots.count=1024)")
    try:
        value = msgspec.toml.decode(f"v = {raw.strip()}".encode())["v"]
    except msgspec.DecodeError:
        value = raw.strip()
    return ".".join(parts), value


@dataclass(frozen=True)
class Variant:
    """Changes to a config file beyond where the benchmark runs; none: as shipped."""

    changes: tuple[tuple[str, Any], ...] = ()
    config_file: Path | None = None
    """Start from this file instead of the shipped one (``--config``)."""
    batch: int = 0
    """``--batch N``: the no-op is a batch handler (``batch_size=N``) and the raw loop
    reads N at a time and awaits the no-op once per batch; 0: one message a call."""

    @classmethod
    def of(cls, settings: Iterable[str] = (), *, slots: int | None = None,
           config_file: Path | None = None, batch: int = 0) -> Variant:
        changes = dict(parse_setting(s) for s in settings)
        if slots is not None:
            changes["slots.count"] = slots
        return cls(tuple(changes.items()), config_file, batch)

    @property
    def name(self) -> str:
        """``shipped``, or what differs from it (``slots.count=1024``)."""
        parts = [f"config={self.config_file}"] if self.config_file else []
        parts += [f"{path}={_text(value)}" for path, value in self.changes]
        if self.batch:
            parts.append(f"batch={self.batch}")
        return ", ".join(parts) or "shipped"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark's config: the file, where it runs, the variant, and the result."""

    adapter: str
    path: Path
    variant: Variant
    changes: Mapping[str, Any]
    """Every field changed from the file: where it runs, then the variant's."""
    config: Config

    @property
    def label(self) -> str:
        """The file as a user names it (``configs/redis.toml``) when it is the shipped one."""
        if self.variant.config_file is None:
            return f"configs/{self.path.name}"
        return str(self.path)

    def worker_environment(self) -> dict[str, str]:
        """The environment of a ``conveyor worker --config PATH`` that runs this config:
        this process's, without ``CONVEYOR_*`` config variables, plus one
        ``CONVEYOR_SECTION__FIELD`` per change (JSON values, which the loader reads as the
        field's type)."""
        env = worker_environment()
        for dotted, value in self.changes.items():
            env["CONVEYOR_" + dotted.upper().replace(".", "__")] = json.dumps(value)
        return env


def bench_config(adapter: str, placement: Mapping[str, Any],
                 variant: Variant = Variant()) -> BenchConfig:
    """The shipped file of ``adapter`` with ``placement`` (dotted paths: the address, a
    private prefix / topic / broker) and then the variant's changes applied."""
    path = variant.config_file or shipped_path(adapter)
    try:  # read as every command reads a config: at most 1 MiB, UTF-8 (a BOM skipped)
        text = read_config_file(path)
        raw = decode_config_file(text, str(path))
    except ConfigError as exc:
        raise BenchmarkError(str(exc)) from None
    changes = {**placement, **dict(variant.changes)}
    for dotted, value in changes.items():
        *tables, field = dotted.split(".")
        table = raw
        for name in tables:
            table = table.setdefault(name, {})
            if not isinstance(table, dict):
                raise BenchmarkError(f"{dotted}: {name} is not a table in {path}")
        table[field] = value
    touched = {dotted.split(".", 1)[0] for dotted in changes}
    try:  # whole sections as overrides, so errors name the file
        config = parse_config(text, str(path), environ={},
                              overrides={s: raw[s] for s in touched})
    except ConfigError as exc:
        changed = f" (the benchmark changed {', '.join(changes)})" if changes else ""
        raise BenchmarkError(f"{exc}{changed}") from None
    if config.queues.adapter != adapter:
        raise BenchmarkError(f"{path} runs the {config.queues.adapter} adapter, not {adapter}")
    return BenchConfig(adapter, path, variant, changes, config)


def worker_environment() -> dict[str, str]:
    """This process's environment without the ``CONVEYOR_*`` variables that configure a
    worker (``CONVEYOR_SECTION__FIELD`` or a whole section), so a worker started by a
    benchmark runs the file it is given. Credential variables stay."""
    sections = {f.name.upper() for f in msgspec.structs.fields(Config)}

    def configures(name: str) -> bool:
        rest = name.removeprefix("CONVEYOR_")
        return rest != name and ("__" in rest or rest in sections)

    return {k: v for k, v in os.environ.items() if not configures(k)}
