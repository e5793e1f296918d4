"""The console's JSON API on a real redis-server, through Starlette's TestClient: what
the pages read (apps, queues and lag, groups, letters), the write guard (read-only, the
token, cross-site and non-JSON requests refused), bad input as a 4xx with a message, and
no password in anything served."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from conveyor.backends import create_adapter
from conveyor.client import Publish, SyncClient
from conveyor.console.poller import Poller
from conveyor.console.server import TOKEN_HEADER, Settings, broker_name, create_app
from conveyor.platform.config import Config, load_config
from conveyor.platform.ids import StreamId
from conveyor.platform.message import DeadLetter, Message
from conveyor.platform.operations import dlq
from tests.conftest import free_port, wait_until_sync
from tests.integration.redis.conftest import write_config
from tests.servers import SENTINEL_SERVICE, RedisServer

pytestmark = pytest.mark.redis

APP = "shop"
TOKEN = "s3cret-token"


def redis_config(request: pytest.FixtureRequest, tmp_path: Path) -> Config:
    """Two queues on a redis-server of the test's own, or on the module's shared Redis
    Cluster or Sentinel-managed primary under a prefix of the test's own."""
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        return load_config(write_config(tmp_path / "redis.toml", server.url,
                                        queues={"total": 2}))
    prefix = f"console-{uuid.uuid4().hex[:8]}"
    if request.param == "redis-cluster":
        cluster = request.getfixturevalue("redis_cluster")
        redis = {"mode": "cluster", "url": cluster.url, "prefix": prefix}
    else:
        servers = request.getfixturevalue("redis_sentinel")
        redis = {"mode": "sentinel", "url": "redis:///0", "sentinels": servers.addresses,
                 "sentinel_service": SENTINEL_SERVICE, "prefix": prefix}
    return load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": 2}, "redis": redis,
        "balancer": {"membership": "redis"}})


@pytest.fixture(params=[
    pytest.param("redis"),
    pytest.param("redis-cluster", marks=pytest.mark.redis_cluster),
    pytest.param("redis-sentinel", marks=pytest.mark.redis_sentinel),
])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> Config:
    """Two queues with app ``shop``'s group on both, 5 messages waiting, 3 letters."""
    config = redis_config(request, tmp_path)
    prepare_app(config)
    return config


def prepare_app(config: Config) -> None:
    """App ``shop``'s group on every queue, 5 messages waiting, 3 letters."""

    async def prepare() -> None:
        adapter = create_adapter("redis", config)
        try:
            for q in range(config.queues.total):
                await adapter.ensure_group(q, APP)  # type: ignore[attr-defined]
            await adapter.dead_letters.put(APP, [
                DeadLetter.of(Message(f"m{n}", StreamId(ns, f"k{n}"), f'{{"n":{n}}}'.encode(),
                                      headers={"traceparent": f"00-{n:032x}-{n:016x}-01"}),
                              f"{ns}.handle", ValueError(f"bad {n}"), 3)
                for n, ns in ((1, "orders"), (2, "orders"), (3, "mails"))])
        finally:
            await adapter.close()

    asyncio.run(prepare())
    with SyncClient.from_config(config) as client:
        client.publish_batch(Publish("orders", f"o{n}", {"n": n}) for n in range(5))


def client_for(config: Config, *, token: str | None = None,
               app: str | None = None) -> TestClient:
    settings = Settings(config, app, token, "127.0.0.1", broker_name(config))
    return TestClient(create_app(settings, Poller(config, app, interval_s=0.2)),
                      base_url="http://127.0.0.1:8089")


@pytest.fixture
def api(config: Config) -> Iterator[TestClient]:
    with client_for(config, token=TOKEN) as client:
        yield client


def write(api: TestClient, path: str, payload: dict[str, object],
          token: str | None = TOKEN) -> Any:
    headers = {TOKEN_HEADER: token} if token is not None else {}
    return api.post(path, json={"app": APP, **payload}, headers=headers)


def test_the_overview_lists_the_apps_their_queues_lag_and_letters(api: TestClient) -> None:
    data = api.get("/api/overview").json()
    assert data["error"] is None and data["write"] is True
    (shop,) = data["apps"]
    assert (shop["app"], shop["queues"], shop["lag"], shop["dead_letters"]) == (APP, [0, 1], 5, 3)
    status = data["status"][APP]
    assert [q["queue"] for q in status["queues"]] == [0, 1]
    assert status["total_lag"] == 5 and status["dead_letters"] == 3
    assert [g["group"] for g in status["groups"]] == [APP]
    assert data["broker"].startswith("redis ")


def test_charts_are_drawn_from_the_console_s_own_polls(api: TestClient) -> None:
    wait_until_sync(lambda: len(api.get(f"/api/charts?app={APP}").json()["points"]) >= 2,
                    10, "three polls (two rates)")
    points = api.get(f"/api/charts?app={APP}").json()["points"]
    assert len(points) >= 2
    assert points[-1]["lag"] == {"0": points[-1]["lag"]["0"], "1": points[-1]["lag"]["1"]}
    assert sum(points[-1]["lag"].values()) == 5
    assert points[-1]["handled_per_s"] == 0  # no daemon runs
    assert points[-1]["in_per_s"] == 0  # nothing published since
    status = api.get("/api/overview").json()["status"][APP]
    assert sum(q["appended"] for q in status["queues"]) == 5  # the queues' end positions


def test_letters_are_listed_filtered_and_shown_in_full(api: TestClient) -> None:
    listed = api.get("/api/letters", params={"app": APP}).json()
    assert listed["total"] == 3
    assert [entry["key"] for entry in listed["letters"]] == ["k1", "k2", "k3"]
    by_stream = api.get("/api/letters", params={"app": APP, "stream": "mails"}).json()
    assert [entry["key"] for entry in by_stream["letters"]] == ["k3"]
    by_handler = api.get("/api/letters", params={"app": APP, "handler": "orders.handle",
                                                 "error_type": "ValueError"}).json()
    assert [entry["key"] for entry in by_handler["letters"]] == ["k1", "k2"]
    letter_id = listed["letters"][0]["id"]
    shown = api.get(f"/api/letters/{letter_id}", params={"app": APP}).json()
    assert (shown["body"], shown["error"], shown["attempts"], shown["trace_id"]) == (
        '{"n":1}', "bad 1", 3, f"{1:032x}")


def test_bad_input_gets_a_4xx_with_a_message_never_a_traceback(api: TestClient) -> None:
    cases = [
        api.get("/api/letters"),  # no app named, and the console watches every app
        api.get("/api/letters", params={"app": APP, "handler": "x" * 500}),
        api.get("/api/letters/not-an-id", params={"app": APP}),
        api.get("/api/letters/99999999999999-0", params={"app": APP}),
        api.get("/api/letters", params={"app": "bad name!\x01"}),
        write(api, "/api/letters/replay", {"ids": "not a list"}),
        write(api, "/api/letters/replay", {}),
        write(api, "/api/letters/replay", {"ids": ["1-0"], "all": True}),
        write(api, "/api/letters/replay", {"ids": ["99999999999999-0"]}),
        write(api, "/api/letters/purge", {"all": True}),  # not confirmed
    ]
    for response in cases:
        assert 400 <= response.status_code < 500, (response.status_code, response.text)
        message = response.json()["error"]
        assert message and "Traceback" not in message
    assert api.get("/api/letters", params={"app": APP}).json()["total"] == 3  # nothing done


@pytest.mark.parametrize("app", ["a b", "a/b", "é", "a:b"])
def test_an_app_param_that_is_no_app_name_is_a_400_not_the_console_s_config(
    api: TestClient, app: str,
) -> None:
    # Printable, it passed the console's own check, and the store refused it as a
    # ConfigError: 500 "the console's config: app name 'a b' may only contain ...".
    responses = [api.get("/api/letters", params={"app": app}),
                 api.get("/api/charts", params={"app": app}),
                 api.get("/api/letters/1-0", params={"app": app}),
                 api.post("/api/letters/replay", json={"app": app, "ids": ["1-0"]},
                          headers={TOKEN_HEADER: TOKEN})]
    for response in responses:
        assert response.status_code == 400, (response.status_code, response.text)
        assert response.json()["error"] == (
            f"app: {app!r} is not an app name: use 1-128 ASCII letters, digits, '-', '_' "
            "or '.' (it names the consumer group)")
    assert api.get("/api/letters", params={"app": APP}).json()["total"] == 3  # nothing done


def test_a_hostile_write_body_gets_a_4xx_before_the_console_reads_or_parses_it_whole(
    api: TestClient,
) -> None:
    """A body nested 100,000 deep made the JSON parser's RecursionError a 500 (and a
    traceback in the log); a body of many megabytes was read whole into memory."""
    headers = {TOKEN_HEADER: TOKEN, "Content-Type": "application/json"}
    deep = api.post("/api/letters/replay", headers=headers,
                    content=b'{"app": "shop", "ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert deep.status_code == 400 and deep.json()["error"] == "the body is not JSON"
    huge = api.post("/api/letters/replay", headers=headers,
                    content=b'{"app": "shop", "all": true, "x": "' + b"x" * (8 << 20) + b'"}')
    assert huge.status_code == 413 and "at most" in huge.json()["error"]
    assert api.get("/api/letters", params={"app": APP}).json()["total"] == 3  # nothing done


def test_write_actions_need_the_token_json_and_the_same_origin(api: TestClient,
                                                               config: Config) -> None:
    assert write(api, "/api/letters/purge", {"all": True, "confirm": True},
                 token=None).status_code == 403
    assert write(api, "/api/letters/purge", {"all": True, "confirm": True},
                 token="wrong").status_code == 403
    form = api.post("/api/letters/purge", data={"app": APP, "all": "true", "confirm": "true"},
                    headers={TOKEN_HEADER: TOKEN})
    assert form.status_code == 415
    # A media type is case-insensitive: JSON spelt otherwise is read, not refused (415).
    spelt = api.post("/api/letters/purge", content=json.dumps(
        {"app": APP, "ids": ["99999999999999-0"], "confirm": True}),
        headers={TOKEN_HEADER: TOKEN, "Content-Type": "Application/JSON; charset=UTF-8"})
    assert spelt.status_code == 404 and "nothing was done" in spelt.json()["error"], spelt.text
    cross = api.post("/api/letters/purge", json={"app": APP, "all": True, "confirm": True},
                     headers={TOKEN_HEADER: TOKEN, "Origin": "https://evil.example"})
    assert cross.status_code == 403
    rebound = api.get("/api/overview", headers={"Host": "evil.example"})
    assert rebound.status_code == 400
    with client_for(config) as read_only:
        refused = write(read_only, "/api/letters/purge", {"all": True, "confirm": True})
        assert refused.status_code == 403
        assert "--write" in refused.json()["error"]
    assert api.get("/api/letters", params={"app": APP}).json()["total"] == 3


def test_replay_and_purge_act_once_on_what_they_name(api: TestClient, config: Config) -> None:
    listed = api.get("/api/letters", params={"app": APP}).json()["letters"]
    first = listed[0]["id"]
    replayed = write(api, "/api/letters/replay", {"ids": [first]}).json()
    assert [i for i, _ in replayed["replayed"]] == [first]
    again = write(api, "/api/letters/replay", {"ids": [first]})
    assert again.status_code == 404  # gone: it is not published twice
    purged = write(api, "/api/letters/purge", {"all": True, "stream": "mails", "confirm": True})
    assert purged.json() == {"purged": 1}
    left = api.get("/api/letters", params={"app": APP}).json()
    assert [entry["key"] for entry in left["letters"]] == ["k2"]
    assert api.get("/api/overview").json()["status"][APP]["total_lag"] >= 6  # 5 + the replay


def test_replay_all_and_purge_all_go_through_every_page_oldest_first(
    api: TestClient, config: Config, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read a page (here 2 letters) at a time, acted on before the next: every letter the
    filter keeps, in order, and none it does not."""
    monkeypatch.setattr(dlq, "PAGE", 2)

    async def put() -> None:
        adapter = create_adapter("redis", config)
        try:
            await adapter.dead_letters.put(APP, [
                DeadLetter.of(Message(f"b{n}", StreamId("bulk" if n % 3 else "mails", f"b{n}"),
                                      b"{}"), "bulk.handle", ValueError("bad"), 1)
                for n in range(1, 10)])
        finally:
            await adapter.close()

    asyncio.run(put())
    listed = api.get("/api/letters", params={"app": APP}).json()["letters"]
    assert len(listed) == 12
    bulk = [e["id"] for e in listed if e["namespace"] == "bulk"]
    replayed = write(api, "/api/letters/replay", {"all": True, "stream": "bulk"}).json()
    assert ([i for i, _ in replayed["replayed"]], replayed["gone"]) == (bulk, [])
    purged = write(api, "/api/letters/purge", {"all": True, "stream": "mails", "confirm": True})
    assert purged.json() == {"purged": 4}  # k3 and b3, b6, b9
    left = api.get("/api/letters", params={"app": APP}).json()
    assert [entry["key"] for entry in left["letters"]] == ["k1", "k2"]
    assert write(api, "/api/letters/purge", {"all": True, "confirm": True}).json() == {
        "purged": 2}
    assert api.get("/api/letters", params={"app": APP}).json()["total"] == 0


def test_a_group_is_deleted_only_through_the_guard(api: TestClient) -> None:
    unconfirmed = write(api, "/api/groups/delete", {})
    assert unconfirmed.status_code == 400
    unknown = api.post("/api/groups/delete", json={"app": "nobody", "confirm": True},
                       headers={TOKEN_HEADER: TOKEN})
    assert unknown.status_code == 404, unknown.text
    deleted = write(api, "/api/groups/delete", {"confirm": True})
    assert deleted.json()["removed_from"] == [0, 1], deleted.text


def test_a_console_shown_one_app_deletes_no_other_app_s_group(config: Config) -> None:
    """A console started with --app deleted the group of any app named in the body."""

    async def other_group() -> list[int]:
        adapter: Any = create_adapter("redis", config)
        try:
            for q in range(config.queues.total):
                await adapter.ensure_group(q, "other")
            return [q for q in range(config.queues.total) if any(
                g["name"] == b"other"
                for g in await adapter.redis.xinfo_groups(adapter.keys.queue(q)))]
        finally:
            await adapter.close()

    assert asyncio.run(other_group()) == [0, 1]
    with client_for(config, token=TOKEN, app=APP) as one_app:
        refused = one_app.post("/api/groups/delete", json={"app": "other", "confirm": True},
                               headers={TOKEN_HEADER: TOKEN})
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"] == f"app: this console shows app {APP!r} only"
        unnamed = one_app.post("/api/groups/delete", json={"confirm": True},
                               headers={TOKEN_HEADER: TOKEN})
        assert unnamed.status_code == 400 and unnamed.json()["error"] == "app: required"
    assert asyncio.run(other_group()) == [0, 1]  # still there


def test_a_method_a_route_does_not_take_is_a_405_naming_those_it_does(
    tmp_path: Path, redis_server: RedisServer,
) -> None:
    """``GET /api/letters/replay`` was a 400 about the letter ``replay`` (the next route,
    ``/api/letters/{id}``, took it); and no 405 said which methods would do (``Allow``,
    which HTTP asks of one). With the write token: the method is refused before it."""
    config = load_config(write_config(tmp_path / "c.toml", redis_server.url,
                                      queues={"total": 2}))
    posts = ("/api/letters/replay", "/api/letters/purge", "/api/groups/delete")
    gets = ("/", "/letters", "/api/overview", "/api/charts", "/api/letters",
            "/api/letters/1-0", "/static/console.js")
    with client_for(config, token=TOKEN) as api:
        for method, paths, allow in (("GET", posts, {"POST"}), ("HEAD", posts, {"POST"}),
                                     ("PUT", posts, {"POST"}), ("POST", gets, {"GET", "HEAD"}),
                                     ("DELETE", gets, {"GET", "HEAD"})):
            for path in paths:
                response = api.request(method, path, params={"app": APP},
                                       headers={TOKEN_HEADER: TOKEN})
                allowed = set(response.headers.get("allow", "").split(", ")) - {""}
                assert (response.status_code, allowed) == (405, allow), (
                    method, path, response.text)
                if method != "HEAD":
                    assert response.json() == {"error": "Method Not Allowed"}


def test_no_password_is_ever_served(tmp_path: Path, redis_server: RedisServer) -> None:
    password = "hunter2-never-shown"
    redis_server.client().config_set("requirepass", password)
    url = redis_server.url.replace("redis://", f"redis://:{password}@")
    config = load_config(write_config(tmp_path / "pw.toml", url, queues={"total": 2}))
    with client_for(config) as api:
        served = "".join(api.get(path).text for path in
                         ("/", "/daemons", "/letters", "/groups", "/api/overview",
                          "/static/console.js"))
        assert "***" in api.get("/api/overview").json()["broker"]
    assert password not in served


def test_credentials_the_broker_refuses_are_the_console_s_error_not_the_request_s(
    tmp_path: Path, redis_server: RedisServer,
) -> None:
    """A wrong password in the console's own config is a config error ($.redis.url), the
    server's fault: a 500 with the message, not a 400 that blames the request."""
    redis_server.client().config_set("requirepass", "the-right-one")
    url = redis_server.url.replace("redis://", "redis://:a-wrong-one@")
    config = load_config(write_config(tmp_path / "pw.toml", url, queues={"total": 2}))
    with client_for(config) as api:
        letters = api.get("/api/letters", params={"app": APP})
    assert letters.status_code == 500, letters.text
    assert letters.json()["error"].startswith("the console's config: $.redis.url: ")
    assert "a-wrong-one" not in letters.text


def test_pages_are_the_shell_with_the_mode_and_a_strict_policy(api: TestClient,
                                                              config: Config) -> None:
    page = api.get("/letters")
    assert 'data-mode="write"' in page.text and 'data-page="letters"' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert api.get("/static/console.js").status_code == 200
    with client_for(config, app=APP) as one_app:
        assert one_app.get("/api/letters", params={"app": "other"}).status_code == 404
        assert 'data-mode="read-only"' in one_app.get("/").text


def test_a_broker_down_is_a_message_on_the_page_not_a_traceback(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    config = load_config(write_config(tmp_path / "redis.toml", redis_server.url,
                                      queues={"total": 2},
                                      redis={"retry_max_s": 0.5, "connect_timeout_s": 0.5}))
    with client_for(config) as api:
        assert api.get("/api/overview").json()["error"] is None
        redis_server.stop()
        wait_until_sync(lambda: api.get("/api/overview").json()["error"] is not None, 30,
                        "the failed poll on the page")
        letters = api.get("/api/letters", params={"app": APP})
    assert letters.status_code == 502
    assert "Traceback" not in letters.text and letters.json()["error"]


def put_letters(config: Config, app: str, count: int) -> None:
    """``count`` dead letters of ``app``, stored as its daemons would."""

    async def put() -> None:
        adapter = create_adapter("redis", config)
        try:
            await adapter.dead_letters.put(app, [
                DeadLetter.of(Message(f"g{n}", StreamId("orders", f"g{n}"), b"{}"),
                              "orders.handle", ValueError("bad"), 3) for n in range(count)])
        finally:
            await adapter.close()

    asyncio.run(put())


def assert_unknown_app(response: Any, app: str) -> None:
    """A 404 whose one line names ``app`` and the apps there are (``shop`` alone)."""
    assert response.status_code == 404, (response.status_code, response.text)
    assert response.json()["error"] == (
        f"no app {app!r} on this broker: it has no consumer group and no dead letters (a "
        f"typo, or an app that never ran; apps here: {APP})")


def test_an_app_the_broker_does_not_know_is_a_404_naming_the_apps_there(
    api: TestClient, config: Config,
) -> None:
    """``?app=shpo`` (a typo) answered 200 with no letter and no chart: an app with
    nothing to fix. Every endpoint naming it now says it is none."""
    assert_unknown_app(api.get("/api/letters", params={"app": "shpo"}), "shpo")
    assert_unknown_app(api.get("/api/charts", params={"app": "shpo"}), "shpo")
    assert_unknown_app(api.get("/api/letters/1-0", params={"app": "shpo"}), "shpo")
    assert_unknown_app(api.post("/api/letters/replay", json={"app": "shpo", "all": True},
                                headers={TOKEN_HEADER: TOKEN}), "shpo")
    assert_unknown_app(api.post("/api/letters/purge", json={
        "app": "shpo", "ids": ["1-0"], "confirm": True}, headers={TOKEN_HEADER: TOKEN}),
        "shpo")
    assert api.get("/api/letters", params={"app": APP}).json()["total"] == 3  # nothing done


def test_an_app_with_a_group_or_letters_only_or_the_console_s_own_is_known_with_none(
    api: TestClient, config: Config,
) -> None:
    """Known apps keep their empty answers: one with a group and no letter, one whose
    group was deleted and whose letters are kept, and the console's ``--app`` before it
    ever ran."""

    async def group_only() -> None:
        adapter = create_adapter("redis", config)
        try:
            await adapter.ensure_group(0, "idle")  # type: ignore[attr-defined]
        finally:
            await adapter.close()

    asyncio.run(group_only())
    put_letters(config, "gone", 2)
    idle = api.get("/api/letters", params={"app": "idle"})
    assert (idle.status_code, idle.json()["total"]) == (200, 0)
    assert api.get("/api/charts", params={"app": "idle"}).status_code == 200
    gone = api.get("/api/letters", params={"app": "gone"})
    assert (gone.status_code, gone.json()["total"]) == (200, 2)
    assert api.get("/api/charts", params={"app": "gone"}).json()["points"] == []
    replayed = api.post("/api/letters/replay", json={"app": "idle", "all": True},
                        headers={TOKEN_HEADER: TOKEN})
    assert (replayed.status_code, replayed.json()["replayed"]) == (200, [])
    with client_for(config, app="fresh") as one_app:
        fresh = one_app.get("/api/letters")
        assert (fresh.status_code, fresh.json()["total"]) == (200, 0)
        assert one_app.get("/api/charts").status_code == 200
        missing = one_app.get("/api/letters/1-0")
        assert missing.status_code == 404
        assert missing.json()["error"] == (
            "no dead letter '1-0' of app 'fresh' (replayed or purged?)")


def closed_port_config(tmp_path: Path, port: int) -> Config:
    return load_config(write_config(tmp_path / "redis.toml", f"redis://127.0.0.1:{port}/0",
                                    queues={"total": 2}))


def test_a_redis_whose_port_is_closed_is_reported_at_once_as_refusing(
    tmp_path: Path,
) -> None:
    """A closed port read as a broker that does not answer ("no answer from the broker
    within 8s"), after the whole 8 s of the adapter's retries."""
    port = free_port()  # reserved, and nothing listens on it
    poller = Poller(closed_port_config(tmp_path, port), None)

    async def poll() -> float:
        started = time.monotonic()
        try:
            await poller.poll()
        finally:
            await poller.stop()
        return time.monotonic() - started

    took = asyncio.run(poll())
    assert poller.reading.error == (
        f"BrokerConnectionError: redis at 127.0.0.1:{port} refused the connection")
    assert took < 4.0, f"the poll took {took:.1f}s"  # half the 8 s bound: room for a loaded CI


def test_a_redis_that_accepts_and_never_answers_is_reported_at_the_poll_s_bound(
    tmp_path: Path,
) -> None:
    async def poll() -> tuple[float, str | None]:
        held: list[asyncio.StreamWriter] = []

        async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)  # never a byte back

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        poller = Poller(closed_port_config(tmp_path, port), None, timeout_s=2.0)
        started = time.monotonic()
        try:
            await poller.poll()
            took = time.monotonic() - started
        finally:
            await poller.stop()
            for writer in held:
                writer.close()
            server.close()
        assert held, "the console never connected"
        return took, poller.reading.error

    took, error = asyncio.run(poll())
    assert error == "BrokerConnectionError: no answer from the broker within 2s"
    assert 2.0 <= took < 5.0, f"the poll took {took:.1f}s"  # the bound, not the 8 s default


def test_deleting_the_group_of_an_app_that_looks_alive_is_refused(api: TestClient,
                                                                  config: Config) -> None:
    async def read_as_the_app() -> None:  # what a daemon does: a queue read just now
        adapter: Any = create_adapter("redis", config)
        try:
            await adapter.redis.xreadgroup(APP, "someone", {adapter.keys.queue(0): ">"},
                                           count=1)
        finally:
            await adapter.close()

    asyncio.run(read_as_the_app())
    refused = write(api, "/api/groups/delete", {"confirm": True})
    assert refused.status_code == 409, refused.text
    assert "looks alive" in refused.json()["error"]
    assert "force" not in refused.json()["error"]  # the console has no way past it
    assert api.get("/api/overview").json()["apps"][0]["app"] == APP  # still there


def test_one_poll_loop_serves_every_page_and_rests_while_none_looks(config: Config) -> None:
    poller = Poller(config, None, interval_s=0.5, idle_after_s=0.5)
    settings = Settings(config, None, None, "127.0.0.1", broker_name(config))
    with TestClient(create_app(settings, poller), base_url="http://127.0.0.1:8089") as api:
        api.get("/api/overview")
        before = poller.polls
        for _ in range(40):  # forty pages asking at once cost what one does
            assert api.get("/api/overview").status_code == 200
        assert poller.polls - before <= 2
        wait_until_sync(lambda: poller.resting, 10, "the loop to rest with no page asking")
        rested = poller.polls
        assert api.get("/api/overview").json()["polls"] == rested + 1  # woken: a fresh read


def test_the_daemons_json_carries_version_health_and_latency_from_the_heartbeat(
        api: TestClient, config: Config) -> None:
    """What the daemons page shows comes with each daemon's membership record; a record
    of a daemon older than those fields is served with what it has (version ``""``)."""
    from conveyor.backends import coordination
    from conveyor.platform.balancing.membership import MemberInfo

    health = {"at": 1_700_000_000.0, "handled": 12.0, "ready": 1.0, "loop.stalls": 2.0,
              "rate.limit_per_s": 50.0, "rate.waiting": 3.0, "latency.p50_s": 0.0042,
              "latency.p95_s": 0.02, "latency.p99_s": 0.08}

    async def join() -> None:
        membership, leases = coordination(config, APP)
        try:
            await membership.join(MemberInfo("shop-new", "h1", 11, 1.0, health, "9.9.9"))
            await membership.join(MemberInfo("shop-old", "h2", 12, 1.0, {"handled": 1.0}))
        finally:
            await membership.close()
            await leases.close()

    asyncio.run(join())

    def members() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = api.get("/api/overview").json()["status"][APP]["members"]
        return found

    wait_until_sync(lambda: len(members()) == 2, 10, "both daemons in the console's poll")
    new, old = members()
    assert (new["id"], new["version"], new["started_at"]) == ("shop-new", "9.9.9", 1.0)
    assert new["stats"] == {**health, "handled": 12, "ready": 1, "loop.stalls": 2,
                            "rate.limit_per_s": 50.0, "rate.waiting": 3}
    assert (old["id"], old["version"], old["stats"]) == ("shop-old", "", {"handled": 1})


def test_records_the_broker_deleted_unhandled_are_a_warning_on_every_page(
        api: TestClient, config: Config) -> None:
    """A daemon's heartbeat counts records the broker deleted before they were handled
    (``queue.N.lost``, a Kafka retention ahead of the app): the console says so above
    every page, in the words of ``conveyor status --app``; a daemon that lost nothing
    adds no line."""
    from conveyor.backends import coordination
    from conveyor.platform.balancing.membership import MemberInfo

    async def join() -> None:
        membership, leases = coordination(config, APP)
        try:
            await membership.join(MemberInfo("shop-lost", "h1", 11, 1.0,
                                             {"handled": 5.0, "queue.3.lost": 1200.0,
                                              "queue.1.lost": 0.0}))
            await membership.join(MemberInfo("shop-fine", "h2", 12, 1.0, {"handled": 5.0}))
        finally:
            await membership.close()
            await leases.close()

    asyncio.run(join())
    line = (f"app {APP}: shop-lost: queue 3: 1,200 message(s) deleted by the broker before "
            "being handled")

    def warned() -> list[str]:
        return [w for w in api.get("/api/overview").json()["warnings"] if "deleted" in w]

    wait_until_sync(lambda: warned() == [line], 10, "the lost records in the warnings")


@pytest.mark.parametrize("config", ["redis"], indirect=True)
def test_a_group_another_tool_named_is_listed_and_the_apps_still_polled(
    config: Config,
) -> None:
    # Its name is no app's: every poll failed with "app name ... may only contain".
    async def foreign() -> None:
        adapter = create_adapter("redis", config)
        try:
            await adapter.redis.xgroup_create(  # type: ignore[attr-defined]
                adapter.keys.queue(0), "<img src=x onerror=alert(1)>", id="0")  # type: ignore[attr-defined]
        finally:
            await adapter.close()

    asyncio.run(foreign())
    with client_for(config) as api:
        data = api.get("/api/overview").json()
    assert data["error"] is None, data["error"]
    assert sorted(a["app"] for a in data["apps"]) == ["<img src=x onerror=alert(1)>", APP]
    assert list(data["status"]) == [APP]


@pytest.mark.parametrize("config", ["redis"], indirect=True)
def test_a_list_of_letters_carries_a_bounded_part_of_each(config: Config) -> None:
    # 200 letters of a producer's megabyte key made a response of hundreds of MB.
    big = "K" * (1 << 20)

    async def put() -> None:
        adapter = create_adapter("redis", config)
        try:
            await adapter.dead_letters.put(APP, [DeadLetter.of(
                Message("big", StreamId("orders", big), b"{}", headers={"h": big}),
                "orders.handle", ValueError(big), 3)])
        finally:
            await adapter.close()

    asyncio.run(put())
    with client_for(config) as api:
        listed = api.get("/api/letters", params={"app": APP})
        [letter] = [x for x in listed.json()["letters"] if x["message_id"] == "big"]
        shown = api.get(f"/api/letters/{letter['id']}", params={"app": APP}).json()
    assert len(listed.content) < 20_000, len(listed.content)
    assert "headers" not in letter and letter["key"] == big[:1024]
    assert letter["cut"] == {"key": len(big), "error": len(shown["error"])}
    assert shown["key"] == big and shown["headers"] == {"h": big}  # the detail: whole


def status_warnings(config: Path) -> list[str]:
    """The warnings ``conveyor status --config CONFIG`` prints, without their prefix."""
    result = subprocess.run([sys.executable, "-m", "conveyor", "status", "--config",
                             str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    prefix = "conveyor: warning: "
    return [line.removeprefix(prefix) for line in result.stderr.splitlines()
            if line.startswith(prefix)]


def test_the_console_warns_of_what_status_warns_of(redis_server: RedisServer,
                                                  tmp_path: Path) -> None:
    """A Redis that evicts, and messages a producer with a larger total put past the
    console's ``[queues] total``: every page gets the lines ``conveyor status`` prints;
    a server that does neither gets none of them."""
    path = write_config(tmp_path / "redis.toml", redis_server.url, queues={"total": 2})
    config = load_config(path)
    with client_for(config) as api:
        quiet = api.get("/api/overview").json()["warnings"]
    assert not [w for w in quiet if "maxmemory-policy" in w or "past [queues]" in w], quiet
    assert quiet == status_warnings(path)  # the server's persistence, if it is none

    wider = load_config(write_config(tmp_path / "wide.toml", redis_server.url,
                                     queues={"total": 8}))
    with SyncClient.from_config(wider) as client:
        client.publish_batch(Publish("orders", f"o{n}", {"n": n}) for n in range(100))
    redis_server.client().config_set("maxmemory-policy", "allkeys-lru")
    with client_for(config) as api:
        warnings = api.get("/api/overview").json()["warnings"]
    expected = status_warnings(path)
    assert [w.split(":")[0] for w in expected if "persistence" not in w] == [
        "Redis maxmemory-policy is allkeys-lru",
        f"queues past [queues] total = 2 hold {stored_past(redis_server, 2, 8):,} entries (queue 2"]
    assert warnings == expected


def test_the_console_names_a_key_of_another_type_as_status_does(redis_server: RedisServer,
                                                                 tmp_path: Path) -> None:
    # A string at queue 1's stream failed every poll (the page showed only WRONGTYPE).
    path = write_config(tmp_path / "redis.toml", redis_server.url, queues={"total": 2})
    config = load_config(path)
    with SyncClient.from_config(config) as client:
        client.publish_batch(Publish("orders", f"o{n}", {"n": n}) for n in range(20))
    admin = redis_server.client()
    admin.delete("t:q:1")
    admin.set("t:q:1", "x")
    with client_for(config) as api:
        data = api.get("/api/overview").json()
    assert data["error"] is None, data["error"]
    assert [w for w in data["warnings"] if "t:q:1" in w] == [
        "redis key t:q:1 (queue 1) is a string, not a stream: no daemon reads the queue, a "
        "publish to it fails and status counts it empty; rename or delete the key"]
    assert data["warnings"] == status_warnings(path)


def stored_past(server: RedisServer, total: int, wider: int) -> int:
    client = server.client()
    return sum(client.xlen(f"t:q:{q}") for q in range(total, wider))


def prepared_redis(redis_server: RedisServer, tmp_path: Path) -> tuple[Config, redis.Redis]:
    """A config of 2 queues on ``redis_server`` with the app prepared, and a client of
    the server's own (to read its connection counts)."""
    config = load_config(write_config(tmp_path / "redis.toml", redis_server.url,
                                      queues={"total": 2}))
    prepare_app(config)
    return config, redis.Redis.from_url(redis_server.url)


def test_polls_keep_their_redis_connections_open_across_polls(redis_server: RedisServer,
                                                              tmp_path: Path) -> None:
    """Each poll opened an adapter and each app's membership and lease stores, and closed
    them: new connections every poll. Kept, a poll after the first connects no more
    (the server's own count of connections received)."""
    config, server = prepared_redis(redis_server, tmp_path)

    def connections() -> int:
        return int(server.info("stats")["total_connections_received"])

    async def polls() -> int:
        poller = Poller(config, None)
        try:
            await poller.poll()  # the first poll connects
            before = connections()
            for _ in range(5):
                await poller.poll()
                reading = poller.reading
                assert reading.error is None, reading.error
                assert reading.apps is not None
                assert [(a.app, a.lag, a.dead_letters) for a in reading.apps.apps] == [
                    (APP, 5, 3)]
                assert reading.status[APP].total_lag == 5
            return connections() - before
        finally:
            await poller.stop()

    try:
        assert asyncio.run(polls()) == 0
    finally:
        server.close()


def test_the_connection_an_app_s_stores_kept_is_closed_once_its_group_is_gone(
        redis_server: RedisServer, tmp_path: Path) -> None:
    config, server = prepared_redis(redis_server, tmp_path)

    def connected() -> int:
        return int(server.info("clients")["connected_clients"])

    async def groups(do: str) -> None:
        adapter: Any = create_adapter("redis", config)
        try:
            if do == "create":
                for q in range(2):
                    await adapter.ensure_group(q, "gone")
            else:
                await adapter.groups.delete("gone", range(2))
        finally:
            await adapter.close()

    async def polls() -> tuple[int, int]:
        poller = Poller(config, None)
        try:
            await groups("create")
            await poller.poll()
            assert poller.reading.apps is not None
            assert sorted(a.app for a in poller.reading.apps.apps) == ["gone", APP]
            with_both = connected()
            await groups("delete")
            await poller.poll()
            assert [a.app for a in poller.reading.apps.apps] == [APP]
            return with_both, connected()
        finally:
            await poller.stop()

    try:
        with_both, after = asyncio.run(polls())
        assert after == with_both - 1  # the stores of "gone" shared one connection
    finally:
        server.close()
