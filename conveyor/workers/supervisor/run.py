"""What ``conveyor worker APP --processes MIN:MAX`` runs: a supervisor until a signal.

The CLI's ``--set`` overrides reach the children as ``CONVEYOR_SECTION__FIELD``
variables (:func:`env_for_overrides`), since each child loads the config itself, and its
``--log-level`` as :data:`~conveyor.workers.supervisor.protocol.LOG_LEVEL_ENV`
(:func:`child_env`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

from conveyor.platform.config import Config
from conveyor.platform.errors import InvalidArgumentError
from conveyor.platform.telemetry import Telemetry
from conveyor.workers.daemon import DrainReport
from conveyor.workers.supervisor.protocol import LOG_LEVEL_ENV
from conveyor.workers.supervisor.scaler import SupervisorSettings
from conveyor.workers.supervisor.supervisor import Supervisor


def parse_processes(text: str) -> tuple[int, int]:
    """``"2:6"`` -> (2, 6); ``"3"`` -> (3, 3)."""
    low, sep, high = text.partition(":")
    try:
        lo = int(low)
        hi = int(high) if sep else lo
    except ValueError:
        raise InvalidArgumentError(f"expected MIN:MAX (e.g. 1:4), got {text!r}") from None
    if not 1 <= lo <= hi:
        raise InvalidArgumentError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


def env_for_overrides(overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """CLI overrides as ``CONVEYOR_SECTION__FIELD`` variables, so children see them too."""
    return {
        f"CONVEYOR_{section.upper()}__{name.upper()}": json.dumps(value)
        for section, values in overrides.items()
        for name, value in values.items()
    }


def child_env(overrides: Mapping[str, Mapping[str, Any]],
              log_level: str | None = None) -> dict[str, str]:
    """What the children's environment adds to the supervisor's: the CLI's overrides
    (:func:`env_for_overrides`) and, when given, its log level (``warning`` ->
    ``WARNING``), which each child sets up its logging with."""
    env = env_for_overrides(overrides)
    if log_level is not None:
        env[LOG_LEVEL_ENV] = log_level.upper()
    return env


def run_supervisor(
    app_path: str,
    app_name: str,
    config: Config,
    processes: str,
    config_path: os.PathLike[str] | str | None,
    overrides: Mapping[str, Mapping[str, Any]],
    ready: Callable[[str], None] | None = None,
    log_level: str | None = None,
    config_text: bytes | None = None,
) -> DrainReport:
    """What ``conveyor worker --processes`` runs: until SIGINT/SIGTERM, then drain all.

    ``ready`` gets the daemon ids of the first processes once they own every queue; the
    result adds up the drain reports of every process stopped meanwhile (scaled down,
    then the rest), as one daemon's drain report reads. ``log_level`` (the CLI's
    ``--log-level``) is the children's too; unset, they log at ``INFO``. ``config_text``,
    the bytes of the file at ``config_path`` as this process read them, is what every
    child parses, rather than reading the path again (see :class:`Supervisor`)."""
    low, high = parse_processes(processes)
    settings = SupervisorSettings.from_config(config, low, high)
    telemetry = Telemetry.from_config(config.telemetry, prometheus=config.http.port is not None)
    try:
        supervisor = Supervisor(
            app_path, app_name, config, settings,
            config_path=None if config_path is None else str(config_path),
            config_text=config_text,
            env=child_env(overrides, log_level), telemetry=telemetry,
        )
    except BaseException:  # e.g. the memory adapter, refused: flush nothing half-made
        telemetry.shutdown()
        raise

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        endpoint = None
        if config.http.port is not None:  # one endpoint, the children's behind it
            from conveyor.workers.supervisor.endpoint import supervisor_endpoint

            endpoint = supervisor_endpoint(supervisor, telemetry, config.http.host,
                                           config.http.port)
            await endpoint.start()
        try:
            await supervisor.run(stop, ready)
        finally:
            if endpoint is not None:
                await endpoint.close()

    try:
        asyncio.run(main())
    finally:
        telemetry.shutdown()
    fields = {f.name for f in dataclasses.fields(DrainReport)}
    return DrainReport(**{name: supervisor.drained.get(name, 0) for name in fields})
