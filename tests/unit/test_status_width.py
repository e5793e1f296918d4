"""``conveyor status --app`` in an 80-column terminal (``COLUMNS=80``, through click's
runner, on a report read from no broker): the title and the server's settings each on
lines of their own, nothing wrapped mid-phrase; ``--wide`` at the width its rows need,
no heading cut to ``q…``; and ``--app`` checked as an app name before anything is read.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from rich.console import Console

from conveyor.cli import main
from conveyor.cli.render import apps_view, groups_view
from conveyor.platform.config import Config
from conveyor.platform.operations import status as operations
from conveyor.platform.operations.groups import GroupStatus
from conveyor.platform.operations.status import (
    AppsReport,
    AppSummary,
    MemberStatus,
    QueueStatus,
    StatusReport,
)

DAEMON = "shop-worker-7f9c4b2d-host-12345-1a2b3c4d"
WIDE_HEADINGS = ["daemon", "queues", "slots", "handled", "dead", "skipped", "host", "pid",
                 "version", "p95", "stalls", "pools / cells (workers)"]


def report() -> StatusReport:
    stats = {"handled": 1_234_567.0, "dead_lettered": 12.0, "skipped": 0.0,
             "slots.in_use": 64.0, "slots.available": 64.0, "loop.stalls": 0.0}
    return StatusReport(
        "shop-orders-eu", [MemberStatus(DAEMON, "worker-host-1.example.internal", 12345,
                                        stats, list(range(8)), "1.2.3")],
        [QueueStatus(q, DAEMON, 1_234_567) for q in range(8)], at=1.0, dead_letters=1_234,
        eviction_policy="noeviction", persistence="none")


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    async def collect(config: Config, group: str, backend: object) -> StatusReport:
        return report()

    monkeypatch.setattr(operations, "collect_status", collect)
    path = tmp_path / "redis.toml"
    path.write_text('[queues]\nadapter = "redis"\n\n[redis]\nurl = "redis://127.0.0.1:1/0"\n'
                    '\n[balancer]\nmembership = "redis"\n')
    return path


def status(config_file: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["status", "--config", str(config_file), *args],
                              env={"COLUMNS": "80"})


def test_the_title_and_the_servers_settings_fit_80_columns_each_on_its_line(
    config_file: Path,
) -> None:
    result = status(config_file, "--app", "shop-orders-eu")
    assert result.exit_code == 0, result.output
    lines = [line.rstrip() for line in result.stdout.splitlines()]
    assert max(map(len, lines)) <= 80, "\n".join(lines)
    assert lines[:2] == [
        "app shop-orders-eu: 1 daemon(s), 1,234 dead letter(s) stored, lag 9,876,536",
        "redis: maxmemory-policy noeviction, persistence none",
    ]
    assert "Redis persistence is none" in result.stderr


def test_wide_prints_whole_rows_and_cuts_no_heading(config_file: Path) -> None:
    result = status(config_file, "--app", "shop-orders-eu", "--wide")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    [heading] = [line for line in lines if line.split()[:1] == ["daemon"]]
    assert heading.split() == " ".join(WIDE_HEADINGS).split(), heading
    assert "…" not in result.stdout
    [row] = [line for line in lines if line.split()[:1] == [DAEMON]]
    assert "worker-host-1.example.internal" in row.split() and "1,234,567" in row


@pytest.mark.parametrize("app", ["", "a b", "shop:orders", "x" * 129])
def test_an_app_that_is_no_app_name_is_a_usage_error_naming_app(
    config_file: Path, app: str,
) -> None:
    result = status(config_file, "--app", app)
    assert result.exit_code == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"conveyor: error: Invalid value for '--app': {app!r} is not an "
                           "app name: use 1-128 ASCII letters"), line


LONG_APP = "a" * 100 + "-orders.eu_2"
"""An app name as long as a name may be (128 at most): wider than 80 columns alone."""


def rendered(renderable: object) -> list[str]:
    console = Console(width=80, force_terminal=False, color_system=None)
    with console.capture() as captured:
        console.print(renderable)
    return [line.rstrip() for line in captured.get().splitlines()]


def test_a_name_wider_than_the_terminal_hides_no_column() -> None:
    """A no-wrap name column wider than 80 columns took the whole width: `status` and
    `groups list` showed the name cut with "…" and no lag, queues or daemons at all."""
    apps = rendered(apps_view(AppsReport(
        [AppSummary(LONG_APP, 2, list(range(8)), 123_456, 1.0, 7)], True, at=1.0)))
    groups = rendered(groups_view(
        [GroupStatus(LONG_APP, list(range(8)), 123_456, 1.0, None, [3])], True, 1.0))
    for lines, headings in ((apps, ["daemons", "queues", "lag", "last read", "dead letters"]),
                            (groups, ["queues", "lag", "last read", "holds retention"])):
        assert max(map(len, lines)) <= 80, "\n".join(lines)
        text = "\n".join(lines)
        for heading in headings:
            assert heading in text, text
        assert "123,456" in text and "0-7" in text, text
        assert "…" not in text, text  # the name whole, over lines, to copy into --app
        rows = [line for line in lines[3:] if line.startswith(" ")]  # not the notes
        assert "".join(line.split()[0] for line in rows) == LONG_APP, text
