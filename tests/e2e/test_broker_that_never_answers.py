"""Operator commands against a Kafka broker that accepts connections and never answers
(a hung broker, a port taken by something else): each ends in one line, exit 1, within
``[kafka] command_timeout_ms`` — not aiokafka's 40 s per request, as it did before
(``status --app`` waited twice, 80 s); so do the console's dead-letter actions. The
default (10 s) is read, not waited for: ``tests/unit/test_kafka_client_options.py``."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.console import actions
from conveyor.platform.config import load_config
from conveyor.platform.errors import BrokerConnectionError
from tests.e2e.test_cli import broker_config, conveyor

BOUND_S = 4.0
"""The command timeout these tests set: short, and long enough that a command waiting
twice (2 x BOUND_S) cannot pass for one that waited once plus the jitter of its start-up
(a CI machine under load once put 1.4 s between two start-ups of one command: 2 s, the
timeout before, left too little between once and twice)."""

COMMANDS = [
    ["status"],
    ["status", "--app", "shop"],  # the group's members, then the daemons' reports
    ["groups", "list"],
    ["groups", "delete", "--app", "shop"],
    ["dlq", "list", "--app", "shop"],
    ["dlq", "show", "0:0", "--app", "shop"],  # a Kafka letter id
    ["dlq", "replay", "--all", "--app", "shop"],
    ["dlq", "purge", "--all", "--yes", "--app", "shop"],
    ["rewind", "--app", "shop", "--to", "2026-11-28T00:00:00Z"],
]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose listener never accepts: the kernel completes each connection, and the
    requests sent on it are never read, let alone answered."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        yield silent.getsockname()[1]


@pytest.fixture
def refusing_port() -> int:
    """A port nothing listens on: each connection is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def timed(command: list[str], config: Path) -> tuple[float, str]:
    """The command's exit-1 run against ``config``: its seconds and its one stderr line."""
    started = time.monotonic()
    result = conveyor(*command, "--config", str(config), timeout=60,
                      env={"CONVEYOR_KAFKA__COMMAND_TIMEOUT_MS": str(int(BOUND_S * 1000))})
    took = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.splitlines()  # no traceback, no aiokafka line
    return took, line


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_an_operator_command_ends_in_one_line_within_the_command_timeout(
    tmp_path: Path, silent_port: int, refusing_port: int, command: list[str]
) -> None:
    # The command's start-up (interpreter, imports, config) is timed in the same run, on
    # a broker that refuses at once: on a loaded CI machine it took 2-3 s, as long as
    # the timeout itself, so a bound on the total could not tell one wait from two.
    (tmp_path / "refused").mkdir()
    start_up, _ = timed(command, broker_config(tmp_path / "refused", "kafka", refusing_port))
    took, line = timed(command, broker_config(tmp_path, "kafka", silent_port))
    assert re.fullmatch(rf"conveyor: error: kafka: [a-z' ]+ failed: no broker reachable at "
                        rf"127\.0\.0\.1:{silent_port} \(\$\.kafka\.bootstrap\)", line), line
    waited = took - start_up
    assert took >= BOUND_S, f"{' '.join(command)} took {took:.1f}s"
    assert waited < 1.5 * BOUND_S, (  # waiting twice would add 2 x BOUND_S
        f"{' '.join(command)} took {took:.1f}s, {waited:.1f}s more than refused at once")


@pytest.mark.parametrize("action", ["list", "replay"])
async def test_a_console_action_ends_with_the_broker_named_within_the_command_timeout(
    silent_port: int, action: str
) -> None:
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "kafka"}, "balancer": {"kind": "kafka-group"},
        "kafka": {"bootstrap": f"127.0.0.1:{silent_port}", "command_timeout_ms": 1000}})
    choice = actions.Choice("shop", every=True)
    started = time.monotonic()
    with pytest.raises(BrokerConnectionError, match=rf"no broker reachable at "
                       rf"127\.0\.0\.1:{silent_port} \(\$\.kafka\.bootstrap\)"):
        if action == "list":
            await actions.list_letters(config, choice)
        else:
            await actions.replay_letters(config, choice)
    took = time.monotonic() - started
    assert 1.0 <= took < 2.0, f"{action} took {took:.1f}s"
