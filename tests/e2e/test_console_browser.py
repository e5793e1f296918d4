"""`conveyor console` in a real headless browser (Debian's chromium, driven by Playwright)
against a real redis-server and real workers: the overview shows the lag falling while
a worker drains a backlog; a poison message appears in dead letters; a write without the
token is refused; purge asks first; a replay from the page is handled exactly once and the
letter disappears. A screenshot of each page is saved under the test's tmp dir (its path
is printed)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import conveyor
from conveyor.backends import create_adapter
from conveyor.client import Publish, SyncClient
from conveyor.platform.config import Config, load_config
from conveyor.platform.ids import StreamId
from conveyor.platform.message import DeadLetter, Message
from tests.conftest import free_port, server_missing, wait_until_sync
from tests.e2e.test_dlq import config_path
from tests.integration.redis.conftest import Worker, workers

pytestmark = pytest.mark.slow
# Fixtures shared with other tests: a redis or a kafka config of 2 queues (the dlq tests'),
# and the workers a test starts, killed at teardown.
__all__ = ["config_path", "workers"]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CONVEYOR_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
TOKEN = "console-e2e-token"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium through Playwright (never a downloaded browser)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        server_missing("playwright (the dev extra)")
    if shutil.which(CHROMIUM) is None and not Path(CHROMIUM).exists():
        server_missing(f"chromium at {CHROMIUM} (apt-get install chromium; `make servers`)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh tab; at the end, no script error nor policy violation may have happened
    (a refused request's status is logged by the browser and is expected)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    try:
        tab = context.new_page()
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error"
               and not msg.text.startswith("Failed to load resource") else None)
        yield tab
    finally:
        context.close()
    assert not errors, errors


class Console:
    """A ``conveyor console`` subprocess on a free port."""

    def __init__(self, config: Path, *, write: bool, app: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = ["--port", str(self.port), "--interval", "0.5", *(["--write"] if write else []),
                *(["--app", app] if app else [])]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "console", "--config", str(config), *args],
            cwd=ROOT, env={**os.environ, "CONVEYOR_CONSOLE_TOKEN": TOKEN,
                           "PYTHONFAULTHANDLER": "1"},  # a hang's stack, when it is aborted
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        wait_until_sync(self.ready, 30, "the console to serve")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the console exited: {self.proc.communicate()}")
        try:
            with urllib.request.urlopen(self.url + "/api/overview", timeout=5) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def stop(self) -> str:
        self.proc.terminate()
        try:
            out, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)  # faulthandler prints where it hangs
            out, err = self.proc.communicate()
            raise AssertionError(f"the console did not stop on SIGTERM: {err}") from None
        assert "Traceback" not in err, err
        return out


@pytest.fixture
def console(config_path: Path) -> Iterator[Console]:
    running = Console(config_path, write=True)
    try:
        yield running
    finally:
        if running.proc.poll() is None:
            running.stop()


def screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"console-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def ensure_groups(config: Config, app: str) -> None:
    """The app's group on every queue at the first message, as its first daemon would
    start it: from there the backlog counts as lag before any daemon runs."""

    async def run() -> None:
        adapter = create_adapter(config.queues.adapter, config)
        try:
            await adapter.rewind_queues(range(config.queues.total), app, 0.0,
                                        create_group=True)
        finally:
            await adapter.close()

    off_loop(lambda: asyncio.run(run()))


def off_loop(work: Callable[[], object]) -> None:
    """Run ``work`` in a thread of its own: Playwright's sync API holds this thread's
    event loop, and the broker clients run their own."""
    with ThreadPoolExecutor(1) as thread:
        thread.submit(work).result()


def put_letters(config: Config, app: str, letters: list[DeadLetter]) -> None:
    """Store ``letters`` as ``app``'s dead letters, as its daemons would."""

    async def put() -> None:
        adapter = create_adapter(config.queues.adapter, config)
        try:
            await adapter.dead_letters.put(app, letters)
        finally:
            await adapter.close()

    off_loop(lambda: asyncio.run(put()))


def publish(config: Config, messages: list[Publish]) -> None:
    def send() -> None:
        with SyncClient.from_config(config) as client:
            client.publish_batch(messages)

    off_loop(send)


@pytest.mark.parametrize("config_path", [pytest.param("redis", marks=pytest.mark.redis),
                                         pytest.param("kafka", marks=pytest.mark.kafka)],
                         indirect=True)
def test_the_overview_shows_the_lag_falling_while_a_worker_drains_a_backlog(
    config_path: Path, console: Console, page: Any, tmp_path: Path, workers: list[Worker],
) -> None:
    config = load_config(config_path)
    backlog = 240
    publish(config, [Publish("items", f"k{n % 4}", {"seq": n}) for n in range(backlog)])
    ensure_groups(config, "rec")
    page.goto(console.url + "/?app=rec")
    lag = page.locator("#total-lag")
    wait_until_sync(lambda: lag.count() == 1 and lag.inner_text() == str(backlog), 20,
                    "the backlog as the app's lag")
    assert page.locator("table").nth(1).locator("tbody tr").count() == 2  # one row a queue
    screenshot(page, tmp_path, "overview-backlog")

    # With an [http] port the worker has a meter: it publishes its handler latency.
    workers.append(Worker("w1", config_path, tmp_path, work_ms=40,
                          env={"CONVEYOR_HTTP__PORT": str(free_port()),
                               "CONVEYOR_HTTP__HOST": "127.0.0.1"}))
    seen: list[int] = []

    def drained() -> bool:
        text = lag.inner_text().replace(",", "")
        if not seen or seen[-1] != int(text):
            seen.append(int(text))
            if len(seen) == 4:
                screenshot(page, tmp_path, "overview-draining")
        return seen[-1] == 0

    wait_until_sync(drained, 60, "the lag to reach 0 on the page")
    assert seen[0] == backlog and seen[-1] == 0
    assert any(0 < value < backlog for value in seen), seen  # seen falling, not jumping
    assert seen == sorted(seen, reverse=True), seen
    records = (tmp_path / "w1.rec").read_text().splitlines()
    assert len(records) == backlog  # all handled, once each (no worker died)
    page.goto(console.url + "/daemons?app=rec")
    page.locator("td span.state", has_text="ready").first.wait_for(timeout=15_000)
    row = page.locator("tbody tr").first.inner_text()
    assert conveyor.__version__ in row, row
    screenshot(page, tmp_path, "daemons")
    page.goto(console.url + "/groups?app=rec")
    page.locator("td", has_text="rec").first.wait_for(timeout=15_000)
    screenshot(page, tmp_path, "groups")
    page.goto(console.url + "/?app=rec")
    wait_until_sync(lambda: page.locator("figure svg").count() == 4, 15,
                    "the four charts (handled, dead-lettered, lag, latency)")
    screenshot(page, tmp_path, "overview")
    charted = page.request.get(console.url + "/api/charts?app=rec").json()["points"]
    assert max(p["handled_per_s"] for p in charted) > 0
    p50 = [p["latency_ms"]["p50"] for p in charted if p["latency_ms"]["p50"] is not None]
    assert p50 and 25 <= max(p50) <= 250, p50  # 40 ms calls: the (25, 50] ms bucket
    assert workers[0].stop() == 0


def handled(out: Path) -> list[tuple[int, str, str]]:
    """(n, message id, replay-of) per handled message, as tests.apps.poison_app wrote."""
    rows = [line.split() for line in out.read_text().splitlines()] if out.exists() else []
    return [(int(n), ident, replay_of) for n, ident, replay_of in rows]


def test_a_poison_letter_is_refused_without_the_token_purged_after_asking_and_replayed_once(
    config_path: Path, console: Console, page: Any, tmp_path: Path, workers: list[Worker],
) -> None:
    config = load_config(config_path)
    out, fixed = tmp_path / "handled.txt", tmp_path / "fixed"
    workers.append(Worker("poison", config_path, tmp_path, app="tests.apps.poison_app:app",
                          env={"CONVEYOR_TEST_OUT": str(out),
                               "CONVEYOR_TEST_FIXED": str(fixed)}))
    publish(config, [Publish("jobs", f"k{n}", {"n": n, "poison": n in (4, 5)})
                     for n in (1, 4, 5)])
    page.goto(console.url + "/letters?app=dlq-e2e")
    rows = page.locator("#letters tbody tr")
    wait_until_sync(lambda: rows.count() == 2, 60, "two poison letters on the page")
    assert [n for n, _, _ in handled(out)] == [1]
    # The overview comes from the console's own poll loop, which may not have read the
    # app since its letters appeared: wait for its next reading, not the first.
    def overview() -> Any:
        return page.request.get(console.url + "/api/overview").json()

    wait_until_sync(lambda: overview()["status"].get("dlq-e2e", {}).get("dead_letters") == 2,
                    30, "the app and its two letters in the overview")
    overview_now = overview()
    status = overview_now["status"]["dlq-e2e"]
    assert overview_now["error"] is None and status["dead_letters"] == 2
    assert [q["queue"] for q in status["queues"]] == [0, 1] and len(status["members"]) == 1

    def row(key: str) -> Any:
        return page.locator("#letters tbody tr", has_text=f"jobs/{key}")

    letter_4 = row("k4").locator("a.letter").inner_text()
    row("k4").locator("a.letter").click()
    page.locator("#letter-body").wait_for()
    assert page.locator("#letter-body").inner_text() == '{"n":4,"poison":true}'
    detail = page.locator("#detail").inner_text()
    assert "poison 4" in detail and "null" not in detail and "undefined" not in detail
    screenshot(page, tmp_path, "letters")

    # Without the token: refused, on the page and at the broker.
    row("k4").locator("button.replay").click()
    error = page.locator("#error")
    error.wait_for(state="visible")
    assert "token" in error.inner_text()
    assert rows.count() == 2

    page.fill("#token", TOKEN)
    asked: list[str] = []

    def dismiss(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    row("k5").locator("button.purge").click()
    wait_until_sync(lambda: len(asked) == 1, 10, "purge to ask for confirmation")
    assert "Purge" in asked[0] and "for good" in asked[0]
    assert rows.count() == 2  # dismissed: nothing purged

    page.once("dialog", lambda dialog: dialog.accept())
    row("k5").locator("button.purge").click()
    wait_until_sync(lambda: rows.count() == 1, 15,
                    f"the purged letter to disappear ({page.locator('#error').text_content()})")

    fixed.touch()  # the fix is deployed
    row("k4").locator("button.replay").click()
    page.locator("#no-letters").wait_for(timeout=15_000)
    assert "replayed 1 letter(s)" in page.locator("#notice").inner_text()
    wait_until_sync(lambda: len(handled(out)) >= 2, 30, "the replayed letter handled")
    assert workers[0].stop() == 0  # drained: anything more would be recorded by now
    # Exactly once, no duplicate allowed: nothing crashed and the worker drained.
    rows_handled = handled(out)
    assert sorted(n for n, _, _ in rows_handled) == [1, 4]
    (replayed,) = [r for r in rows_handled if r[0] == 4]
    assert replayed[2] == letter_4  # its cv-replay-of names the letter
    assert 5 not in [n for n, _, _ in rows_handled]  # purged, never handled


@pytest.mark.redis
@pytest.mark.parametrize("config_path", ["redis"], indirect=True)
def test_a_read_only_console_has_no_write_actions_and_refuses_them(
    config_path: Path, page: Any, tmp_path: Path,
) -> None:
    running = Console(config_path, write=False)
    try:
        page.goto(running.url + "/letters")
        assert page.locator(".mode").inner_text() == "read-only"
        assert page.locator("#token-box").is_hidden()
        answer = page.request.post(running.url + "/api/letters/purge",
                                   data={"app": "x", "all": True, "confirm": True},
                                   headers={"X-Conveyor-Token": TOKEN})
        assert answer.status == 403 and "--write" in answer.json()["error"]
    finally:
        printed = running.stop()
    assert "read-only" in printed and TOKEN not in printed


@pytest.mark.redis
@pytest.mark.parametrize("config_path", ["redis"], indirect=True)
def test_a_console_shown_one_app_offers_to_delete_that_app_s_group_only(
    config_path: Path, page: Any, tmp_path: Path,
) -> None:
    """Every group had a Delete button, and a console started with --app deleted
    another app's group; the server now refuses it, and the page offers no such button."""
    config = load_config(config_path)
    for app in ("shop", "other"):
        ensure_groups(config, app)
    running = Console(config_path, write=True, app="shop")
    try:
        page.goto(running.url + "/groups")
        rows = page.locator("tbody tr")
        wait_until_sync(lambda: rows.count() == 2, 30, "both groups on the page")
        buttons = {rows.nth(n).locator("td").first.inner_text():
                   rows.nth(n).locator("button").count() for n in range(2)}
        assert buttons == {"shop": 1, "other": 0}, buttons
        screenshot(page, tmp_path, "groups-one-app")
    finally:
        running.stop()


@pytest.mark.redis
@pytest.mark.parametrize("config_path", ["redis"], indirect=True)
def test_a_filter_the_console_refuses_is_an_error_on_the_page_not_a_stale_list(
    config_path: Path, console: Console, page: Any,
) -> None:
    """A filter over 200 characters (a long stream key pasted) is refused by the API;
    the page left the unfiltered list under the filter typed, said nothing, and the
    refusal went to the script's console as an unhandled rejection."""
    config = load_config(config_path)
    letters = [DeadLetter.of(Message(f"m{n}", StreamId("orders", f"k{n}"), b"{}"),
                             "orders.handle", ValueError(f"bad {n}"), 3) for n in range(2)]
    put_letters(config, "shop", letters)
    page.goto(console.url + "/letters?app=shop")
    rows = page.locator("#letters tbody tr")
    wait_until_sync(lambda: rows.count() == 2, 30, "both letters on the page")
    page.fill("input[name=stream]", "orders/" + "k" * 300)
    page.click("form.filters button[type=submit]")
    error = page.locator("#error")
    error.wait_for(state="visible", timeout=10_000)
    assert error.inner_text() == "stream: at most 200 printable characters"
    assert rows.count() == 0  # no list that the filter shown did not choose
    assert page.input_value("input[name=stream]") == "orders/" + "k" * 300  # to fix it
    page.fill("input[name=stream]", "orders/k1")
    page.click("form.filters button[type=submit]")
    wait_until_sync(lambda: rows.count() == 1, 10, "the one letter the filter keeps")
    assert error.is_hidden()


HOSTILE = ['<script>window.__pwned = 1</script>', '<img src=x onerror="window.__pwned = 2">',
           '"><svg onload="window.__pwned = 3">', "javascript:window.__pwned = 4",
           "\u202eevil\u202c", "a\u0000b\u0007c\x1b[31m"]


@pytest.mark.redis
@pytest.mark.parametrize("config_path", ["redis"], indirect=True)
def test_what_a_producer_wrote_runs_no_script_and_a_megabyte_key_keeps_the_page_usable(
    config_path: Path, console: Console, page: Any, tmp_path: Path,
) -> None:
    """Markup in every field a producer controls is shown as text; a letter with a
    1 MB key, header and error does not widen the page past the window."""
    config = load_config(config_path)
    big = "K" * (1 << 20)
    letters = [DeadLetter.of(Message(f"m{n}", StreamId(x, x), x.encode(), headers={x: x}),
                             x, ValueError(x), 3, error_type=x)
               for n, x in enumerate(HOSTILE)]
    letters.append(DeadLetter.of(Message("big", StreamId("orders", big), big.encode(),
                                         headers={"h": big}), "orders.handle",
                                 ValueError(big), 3))
    put_letters(config, "shop", letters)
    page.goto(console.url + "/letters?app=shop")
    rows = page.locator("#letters tbody tr")
    wait_until_sync(lambda: rows.count() == len(letters), 30, "every letter on the page")
    width = page.viewport_size["width"]

    def fits() -> bool:
        return bool(page.evaluate("document.documentElement.scrollWidth") <= width)

    assert fits(), page.evaluate("document.documentElement.scrollWidth")
    assert page.locator("#letters tbody tr", has_text=HOSTILE[0]).count() == 1  # as text
    # A right-to-left override would show "evil" as "live": its code point shows instead.
    listed = page.locator("#letters").inner_text()
    assert "\u202e" not in listed and "<U+202E>evil<U+202C>" in listed
    # The list's JSON carries 1,024 characters of the key; the page says how long it is.
    assert f"… ({len('orders/') + len(big):,} characters)" in listed
    for n in range(len(letters)):
        rows.nth(n).locator("a.letter").click()
        page.locator("#detail h2").wait_for()
        assert fits(), (n, page.evaluate("document.documentElement.scrollWidth"))
    assert "Purge" in page.locator("#letters tbody tr").last.inner_text()
    button = page.locator("#letters tbody tr").last.locator("button.purge")
    box = button.bounding_box()
    assert box is not None and box["x"] + box["width"] <= width  # reachable, not off-page
    assert page.evaluate("window.__pwned") is None
    screenshot(page, tmp_path, "hostile-letters")


@pytest.mark.redis
@pytest.mark.parametrize("config_path", ["redis"], indirect=True)
def test_a_letter_with_no_error_type_shows_a_dash_for_it_as_dlq_show_does(
    config_path: Path, console: Console, page: Any,
) -> None:
    """A letter made from a text (``DeadLetter.of(msg, handler, "boom", 1)``) has an
    empty error type: its cell and its detail said nothing (``dlq show``: ``-``)."""
    put_letters(load_config(config_path), "shop", [DeadLetter.of(
        Message("m-untyped", StreamId("jobs", "k1"), b"{}"), "jobs.handle", "boom", 1)])
    page.goto(console.url + "/letters?app=shop")
    row = page.locator("#letters tbody tr").first
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[2:5] == ["jobs.handle", "-", "boom"], cells
    row.locator("a.letter").click()
    field = page.locator("#detail tr", has_text="error_type")
    field.wait_for()
    assert field.locator("td").all_inner_texts() == ["error_type", "-"]


@pytest.mark.redis
@pytest.mark.parametrize("config_path", ["redis"], indirect=True)
def test_a_redis_that_evicts_is_a_warning_on_every_page(
    config_path: Path, page: Any, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    """What ``conveyor status`` warns of, the console shows above every page."""
    request.getfixturevalue("redis_server").client().config_set("maxmemory-policy",
                                                                "allkeys-lru")
    running = Console(config_path, write=False)
    try:
        for name in ("", "daemons", "letters", "groups"):
            page.goto(f"{running.url}/{name}")
            warning = page.locator("#warnings li", has_text="maxmemory-policy")
            warning.wait_for(timeout=10_000)
            assert warning.inner_text().startswith(
                "warning: Redis maxmemory-policy is allkeys-lru: a full server deletes "
                "messages and leases")
        screenshot(page, tmp_path, "warning")
    finally:
        running.stop()


@pytest.mark.parametrize("config_path", [pytest.param("redis", marks=pytest.mark.redis),
                                         pytest.param("kafka", marks=pytest.mark.kafka)],
                         indirect=True)
def test_an_app_the_broker_does_not_know_is_said_so_on_the_page(
    config_path: Path, console: Console, page: Any, tmp_path: Path,
) -> None:
    """``?app=shpo`` (a typo for shop) showed an empty, healthy-looking page: no letter,
    no error. The overview and the dead letters now say it is no app there."""
    config = load_config(config_path)
    ensure_groups(config, "shop")
    line = ("no app 'shpo' on this broker: it has no consumer group and no dead letters (a "
            "typo, or an app that never ran; apps here: shop)")
    page.goto(console.url + "/?app=shpo")
    said = page.locator("#unknown-app")
    said.wait_for(timeout=30_000)
    assert said.inner_text() == line
    page.locator("tbody tr td a", has_text="shop").wait_for(timeout=30_000)  # apps there
    assert said.inner_text() == line  # still said, above them
    screenshot(page, tmp_path, "unknown-app")
    page.goto(console.url + "/letters?app=shpo")
    error = page.locator("#error")
    error.wait_for(state="visible", timeout=30_000)
    assert error.inner_text() == line
    page.goto(console.url + "/?app=shop")  # a known app: its queues, no such line
    page.locator("#total-lag").wait_for(timeout=30_000)
    assert said.count() == 0
    page.goto(console.url + "/letters?app=shop")  # known with no letter: no error
    page.locator("#no-letters").wait_for(timeout=30_000)
    assert page.locator("#error").is_hidden()


@pytest.mark.parametrize("config_path", [pytest.param("redis", marks=pytest.mark.redis),
                                         pytest.param("kafka", marks=pytest.mark.kafka)],
                         indirect=True)
def test_a_dead_letter_page_opened_before_its_app_ran_drops_the_no_app_line_once_it_runs(
    config_path: Path, console: Console, page: Any,
) -> None:
    """The page said "no app" and kept saying it once the app was there, over its letters
    (and an action's refusal then read as that line)."""
    config = load_config(config_path)
    page.goto(console.url + "/letters?app=late")
    error = page.locator("#error")
    error.wait_for(state="visible", timeout=30_000)
    assert error.inner_text().startswith("no app 'late' on this broker")
    ensure_groups(config, "late")  # its first run
    page.locator("#no-letters").wait_for(timeout=30_000)
    error.wait_for(state="hidden", timeout=10_000)
    assert error.inner_text() == ""
