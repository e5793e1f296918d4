"""The rendered ScaledObject's redis-streams triggers read what a real daemon writes.

A daemon of the app runs on a real redis-server; the test reads each trigger's stream
and consumer group the way KEDA does (XINFO GROUPS for ``lagCount``, XPENDING for
``pendingEntriesCount``) and checks that the groups exist and that the triggers' sum
is the app's unfinished work, as the adapter itself counts it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis.asyncio as aioredis

from conveyor import App, Client, Publish
from conveyor.deploy import kubernetes as k8s
from conveyor.platform.config import load_config
from conveyor.workers.daemon import WorkerDaemon
from tests.conftest import wait_until
from tests.integration.redis.conftest import RedisServer, write_config

pytestmark = pytest.mark.redis


class Item(msgspec.Struct):
    key: str
    seq: int


async def keda_reading(client: aioredis.Redis, trigger: dict[str, Any]) -> int:
    """What KEDA's redis-streams scaler reads for ``trigger`` (the group must exist)."""
    meta = trigger["metadata"]
    groups = {g["name"].decode(): g for g in await client.xinfo_groups(meta["stream"])}
    assert meta["consumerGroup"] in groups, (meta["stream"], sorted(groups))
    if "lagCount" in meta:
        lag = groups[meta["consumerGroup"]]["lag"]
        assert lag is not None, "Redis could not tell the lag (KEDA would read none)"
        return int(lag)
    assert "pendingEntriesCount" in meta
    return int((await client.xpending(meta["stream"], meta["consumerGroup"]))["pending"])


async def test_the_triggers_name_the_daemons_streams_and_group_and_sum_its_lag(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    file = write_config(tmp_path / "c.toml", redis_server.url, queues={"total": 4},
                        redis={"prefix": "k8s"}, balancer={"lease_ttl_s": 1.0})
    config = load_config(file, environ={})  # as `conveyor deploy kubernetes` reads it
    gate = asyncio.Event()
    handled: list[tuple[str, int]] = []
    app = App("k8s.shop_1")  # a name Kubernetes objects cannot carry; the group does

    @app.handler("items")
    async def on_item(item: Item) -> None:
        await gate.wait()
        handled.append((item.key, item.seq))

    objects = k8s.render(config, k8s.Options(
        app_path="shop:app", app_name=app.name, config_text=file.read_text(), image="x"))
    [scaled] = [o for o in objects if o["kind"] == "ScaledObject"]
    assert scaled["metadata"]["name"] == "k8s-shop-1-worker"
    triggers = scaled["spec"]["triggers"]
    assert {t["metadata"]["address"] for t in triggers} == {f"127.0.0.1:{redis_server.port}"}
    assert {t["metadata"]["databaseIndex"] for t in triggers} == {"0"}
    published = [Item(f"k{i % 10}", i // 10) for i in range(40)]
    daemon = WorkerDaemon(app, config)
    client = aioredis.Redis(port=redis_server.port)
    await daemon.start()
    try:
        async with Client.from_config(config) as producer:
            await producer.publish_batch([Publish("items", p.key, p) for p in published])

        async def readings() -> tuple[int, int]:
            lag = pending = 0
            for trigger in triggers:
                value = await keda_reading(client, trigger)
                if "lagCount" in trigger["metadata"]:
                    lag += value
                else:
                    pending += value
            return lag, pending

        async def all_pulled_none_done() -> bool:
            return await readings() == (0, len(published))

        # The daemon prefetches everything while its handlers wait: the groups' lag
        # alone reads 0 though nothing is done; with the pending entries the sum is
        # the whole backlog, what the adapter's own lag (conveyor status) says.
        await wait_until(all_pulled_none_done, 20, 0.05, "the daemon to pull all 40")
        own = [await daemon.adapter.lag(q, app.name) for q in range(4)]
        assert sum(own) == len(published)
        gate.set()
        await wait_until(lambda: len(handled) == len(published), 20, 0.05, "all handled")

        async def all_acknowledged() -> bool:
            return await readings() == (0, 0)

        await wait_until(all_acknowledged, 20, 0.05, "the acknowledgements")
    finally:
        gate.set()
        await daemon.stop()
        await client.aclose()
    # No fault here: every message exactly once, none lost, none doubled.
    assert sorted(handled) == sorted((p.key, p.seq) for p in published)


def test_the_rendered_container_runs_and_answers_its_probes(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The Deployment's container args, run as the pod would run them (the ConfigMap's
    file at its mount path, the image's ENTRYPOINT `conveyor`), start a worker whose
    startup, liveness and readiness probes answer 200 on the rendered port and path,
    and which stops within the rendered grace period on SIGTERM."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from tests.conftest import free_port, wait_until_sync
    from tests.integration.redis.conftest import REPO

    file = write_config(tmp_path / "c.toml", redis_server.url, redis={"prefix": "pod"})
    config = load_config(file, environ={})
    port = free_port()
    options = k8s.Options(app_path="tests/apps/recorder.py:app", app_name="rec",
                          config_text=file.read_text(), image="conveyor:test",
                          http_port=port)
    objects = {o["kind"]: o for o in k8s.render(config, options)}
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "config")
    mounted = tmp_path / mount.lstrip("/")
    mounted.mkdir(parents=True)
    for name, text in objects["ConfigMap"]["data"].items():
        (mounted / name).write_text(text)
    args = [a.replace(mount, str(mounted)) for a in container["args"]]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    proc = subprocess.Popen([sys.executable, "-m", "conveyor.cli", *args], cwd=REPO,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def status(probe: str) -> int:
        get = container[probe]["httpGet"]
        url = f"http://127.0.0.1:{ports[get['port']]}{get['path']}"
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return int(reply.status)
        except OSError:
            return 0

    try:
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            wait_until_sync(lambda p=probe: status(p) == 200, 30, f"{probe} to answer 200")
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = proc.wait(pod["terminationGracePeriodSeconds"])
        assert code == 0, proc.stderr.read() if proc.stderr else b""
        assert time.monotonic() - started < pod["terminationGracePeriodSeconds"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
