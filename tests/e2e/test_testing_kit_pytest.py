"""conveyor.testing as a user's pytest run sees it: a project of its own, in pytest-asyncio's
strict mode (the default), with the fixture made by worker_fixture; and the testing page's
example with the page's settings."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.docs_blocks import blocks_of

ROOT = Path(__file__).resolve().parents[2]

USER_APP = '''
import conveyor

app = conveyor.App("shop")


@app.handler("orders")
async def on_order(order: dict[str, int]) -> None:
    print(order["total_cents"] // order["items"])
'''

USER_TESTS = '''
import pytest

import conveyor
from conveyor.testing.fixtures import worker_fixture
from shop_app import app

worker = worker_fixture(app)


@pytest.mark.asyncio
async def test_an_order_with_items(worker):
    await worker.publish("orders", "o-1", {"total_cents": 1200, "items": 2})
    await worker.settle()
    assert worker.bodies() == [{"total_cents": 1200, "items": 2}]


@pytest.mark.asyncio
async def test_an_order_without_items(worker):
    await worker.publish("orders", "o-2", {"total_cents": 1200, "items": 0})
    await worker.settle()


@pytest.mark.asyncio
async def test_a_test_that_forgets_to_settle(worker):
    await worker.publish("orders", "o-3", {"total_cents": 900, "items": 0})


offline = conveyor.App("offline")


@offline.startup
async def connect(client: conveyor.Client) -> None:
    raise ConnectionError("the database is down")


offline_worker = worker_fixture(offline, name="offline_worker")


@pytest.mark.asyncio
async def test_a_startup_hook_that_raises(offline_worker):
    await offline_worker.settle()
'''



def users_pytest(project: Path, config: str) -> subprocess.CompletedProcess[str]:
    """pytest run in ``project`` with its own ``config`` file, Conveyor importable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
         "--rootdir", str(project), "-c", str(project / config), str(project)],
        capture_output=True, text=True, cwd=project, env=env, timeout=120,
    )


def users_ini_pytest(project: Path, tests: dict[str, str], mode: str = "auto",
                     more: str = "") -> subprocess.CompletedProcess[str]:
    """:func:`users_pytest` in ``project`` with the files ``tests`` (name: text) and a
    pytest.ini of pytest-asyncio's ``mode``, function-scoped fixture loops, and
    ``more`` lines."""
    for name, text in tests.items():
        (project / name).write_text(text)
    (project / "pytest.ini").write_text(
        f"[pytest]\nasyncio_mode = {mode}\nasyncio_default_fixture_loop_scope = function\n"
        + more)
    return users_pytest(project, "pytest.ini")


def test_a_users_strict_mode_project_passes_and_a_failure_shows_the_handlers_error(
    tmp_path: Path,
) -> None:
    # the handlers in a module of their own
    ran = users_ini_pytest(tmp_path, {"shop_app.py": USER_APP, "test_shop.py": USER_TESTS},
                           "strict")
    out = ran.stdout
    assert ran.returncode == 1, out + ran.stderr
    assert "2 failed, 2 passed, 1 error" in out, out
    # A test that forgot settle(): its handler's failure is an error at its teardown.
    assert "ERROR at teardown of test_a_test_that_forgets_to_settle" in out
    assert "dead-lettered orders/o-3 on_order, 3 attempts: ZeroDivisionError" in out
    # The handler's own line and error first, then the test's line and the kit's summary.
    handler_error = out.index('print(order["total_cents"] // order["items"])')
    assert out.index("ZeroDivisionError: integer division or modulo by zero") > handler_error
    summary = out.index("dead-lettered orders/o-2 on_order, 3 attempts: ZeroDivisionError")
    assert out.index("await worker.settle()") < summary
    # A startup hook's failure: the hook's line, then the test's.
    hook_error = out.index('raise ConnectionError("the database is down")')
    assert out.index("StartupHookFailed: startup hook connect raised ConnectionError: the "
                     "database is down") > hook_error
    assert "conveyor/testing/worker.py" not in out  # the kit's frames are hidden
    # and so are the delivery path's, between the test's line and the handler's
    assert "conveyor/platform/" not in out and "conveyor/testing/observe.py" not in out


LOOP_TESTS = '''
import conveyor
from conveyor.testing.fixtures import worker_fixture

app = conveyor.App("loops")


@app.handler("names")
async def on_name(name: str) -> None:
    """Takes the name and keeps nothing of it."""


worker = worker_fixture(app)


async def test_a_name(worker):
    await worker.publish("names", "n-1", "Ada")
    await worker.settle()
'''


def test_a_fixture_on_another_loop_than_the_test_is_named_at_once(tmp_path: Path) -> None:
    """Tests on a session loop, fixtures on the default function loop: the worker's
    daemon runs on a loop that stands still while the test awaits. settle() waited its
    10 s and said "not pulled yet"; the kit says what is wrong, at once."""
    began = time.monotonic()
    ran = users_ini_pytest(tmp_path, {"test_loops.py": LOOP_TESTS},
                           more="asyncio_default_test_loop_scope = session\n")
    out = ran.stdout
    assert ran.returncode == 1, out + ran.stderr
    assert "1 failed" in out, out
    assert "cannot publish: this TestWorker was started on another event loop" in out, out
    assert "asyncio_default_fixture_loop_scope" in out, out
    assert time.monotonic() - began < 8, out  # not the settle's 10 s


ANYIO_TESTS = '''
import pytest

import conveyor
from conveyor.testing import TestWorker
from conveyor.testing.fixtures import worker_fixture

app = conveyor.App("anyio")


@app.handler("names")
async def on_name(name: str) -> None:
    """Takes the name and keeps nothing of it."""


worker = worker_fixture(app)


@pytest.fixture
async def own_worker():
    async with TestWorker(app) as worker:
        yield worker


@pytest.mark.anyio
async def test_with_the_made_fixture(worker):
    await worker.publish("names", "n-1", "Ada")
    await worker.settle()


@pytest.mark.anyio
async def test_with_a_fixture_of_its_own(own_worker):
    await own_worker.publish("names", "n-1", "Ada")
    await own_worker.settle()
'''


def test_anyio_tests_need_pytest_asyncios_strict_mode_when_both_are_installed(
        tmp_path: Path) -> None:
    """docs/testing.md: with pytest-asyncio installed too, @pytest.mark.anyio tests take
    the kit's fixtures in its strict mode (the default); in its auto mode it runs every
    async fixture on a loop of its own, and the kit says so at the test's first call.
    (The page said to write the fixture yourself "so that anyio runs it": in auto mode
    that fixture failed too, with a hint about loop scopes only.)"""
    ran = users_ini_pytest(tmp_path, {"test_anyio.py": ANYIO_TESTS}, "strict")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert re.search(r"\b2 passed in ", ran.stdout), ran.stdout
    ran = users_ini_pytest(tmp_path, {}, "auto")
    out = ran.stdout
    assert ran.returncode == 1 and "2 failed" in out, out + ran.stderr
    assert out.count("cannot publish: this TestWorker was started on another event "
                     "loop") >= 2, out
    assert "an anyio test (@pytest.mark.anyio) given a fixture pytest-asyncio ran" in out, out


BLOCKING_TESTS = '''
import time

import pytest

import conveyor
from conveyor.testing.fixtures import worker_fixture

app = conveyor.App("blocking")
calls = []


@app.handler("jobs")
async def block(seconds: float) -> None:
    calls.append(seconds)
    time.sleep(seconds)  # blocks the event loop, as a synchronous client would


worker = worker_fixture(app, settle_timeout_s=30, stop_timeout_s=0.5)


@pytest.mark.timeout(2)
async def test_a_handler_that_blocks_the_loop(worker):
    await worker.publish("jobs", "j-1", 8)
    await worker.settle()


def test_the_handler_was_called_once():
    assert calls == [8]
'''


def test_a_time_limit_that_fires_in_a_handler_blocking_the_loop_fails_its_test(
        tmp_path: Path) -> None:
    """docs/testing.md: an async handler that blocks the loop holds settle(); a per-test
    time limit (pytest-timeout) turns that into a failure. Its Failed exception is raised
    where the main thread is, in the blocking handler: the delivery chain took it for the
    handler's failure (a BaseException), retried the call, and the test passed."""
    ran = users_ini_pytest(tmp_path, {"test_blocking.py": BLOCKING_TESTS})
    out = ran.stdout
    assert ran.returncode == 1, out + ran.stderr
    assert re.search(r"\b1 failed, 1 passed in ", out), out
    assert "Failed: Timeout (>2.0s) from pytest-timeout" in out, out
    assert "time.sleep(seconds)" in out, out  # where it was when the limit fired


FAILING_TESTS = '''
import asyncio

import conveyor
from conveyor.testing.fixtures import worker_fixture

app = conveyor.App("failing")


@app.handler("orders")
async def on_order(total: int) -> None:
    if total < 0:
        raise ValueError("a negative total")


@app.handler("slow")
async def wait_for_ever(n: int) -> None:
    await asyncio.Event().wait()


worker = worker_fixture(app)


async def test_fails_with_a_dead_letter_left(worker):
    await worker.publish("orders", "o-1", -5)
    assert 1 == 2, "the test's own failure"


async def test_fails_with_a_handler_stuck(worker):
    await worker.publish("slow", "s-1", 1)
    assert 1 == 3, "the test's own failure"


async def test_passes_after_them(worker):
    await worker.publish("orders", "o-2", 5)
    await worker.settle()
    assert worker.bodies() == [5]
'''


def test_a_failed_tests_fixture_only_stops_its_worker(tmp_path: Path) -> None:
    """docs/testing.md: a block that ends in an exception is only stopped, the test's own
    error is the one to see. The fixture's block never saw the test's error: it settled
    and checked at the teardown, so a failed test had a second error there (the dead
    letter it left) or, a handler stuck, waited settle_timeout_s (10 s) for NotSettled:
    neither error is in the output. (Not timed: the session alone takes 4-8 s on this
    machine, too close to the 10 s to tell them apart.)"""
    ran = users_ini_pytest(tmp_path, {"test_failing.py": FAILING_TESTS})
    out = ran.stdout
    assert ran.returncode == 1, out + ran.stderr
    assert re.search(r"\b2 failed, 1 passed in ", out), out
    assert "ERROR" not in out and "DeadLettersFound" not in out and "NotSettled" not in out
    assert out.count("the test's own failure") >= 2, out


def test_the_testing_pages_example_passes_in_a_project_of_its_own_with_the_pages_settings(
    tmp_path: Path,
) -> None:
    """docs/testing.md's bookshop (app.py and test_app.py, which the page shows as they
    are) with the page's pyproject settings alone: the async tests run unmarked, and
    pytest-asyncio has nothing to warn about."""
    [settings] = [b for b in blocks_of(ROOT / "docs" / "testing.md")
                  if b.lang == "toml" and b.marker == "own"]
    (tmp_path / "pyproject.toml").write_text(settings.body)
    shop = tmp_path / "bookshop"
    shop.mkdir()
    for name in ("__init__.py", "app.py", "test_app.py"):
        shutil.copy(ROOT / "examples" / "bookshop" / name, shop / name)
    ran = users_pytest(tmp_path, "pyproject.toml")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert re.search(r"\b4 passed in ", ran.stdout), ran.stdout
    assert "warning" not in (ran.stdout + ran.stderr).lower(), ran.stdout + ran.stderr
