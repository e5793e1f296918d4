"""The supervisor's lag decision: up on sustained lag, down through the PID controller."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from conveyor import load_config
from conveyor.adapters.memory import MemoryAdapter
from conveyor.platform.errors import BrokerConnectionError, ConfigError, ConveyorError
from conveyor.platform.telemetry import Telemetry
from conveyor.workers.pools.scaledown import ScaleDownPolicy
from conveyor.workers.supervisor.process import ChildGone, ChildProcess
from conveyor.workers.supervisor.protocol import LOG_LEVEL_ENV
from conveyor.workers.supervisor.run import child_env, env_for_overrides, parse_processes
from conveyor.workers.supervisor.scaler import (
    Decision,
    LagScaler,
    SupervisorSettings,
    choose_victim,
)
from conveyor.workers.supervisor.supervisor import Supervisor
from tests.integration.test_telemetry import metric_values


def settings(**kw: object) -> SupervisorSettings:
    base: dict[str, object] = {
        "min_processes": 1, "max_processes": 3, "lag_per_process": 100,
        "idle_lag_per_process": 5, "scale_up_cycles": 2, "scale_up_backoff_s": 2.0,
        "scale_down": ScaleDownPolicy(inspection_period_s=1.0, dead_zone_cycles=2,
                                      backoff_s=2.0),
    }
    base.update(kw)
    return SupervisorSettings(**base)  # type: ignore[arg-type]


def test_sustained_lag_adds_a_process_but_one_spike_does_not() -> None:
    scaler = LagScaler(settings())
    assert scaler.decide(1, [500], 8) is Decision.HOLD  # one inspection above: not yet
    assert scaler.decide(2, [50], 8) is Decision.HOLD  # fell back: the count restarts
    assert scaler.decide(3, [500], 8) is Decision.HOLD
    assert scaler.decide(4, [500], 8) is Decision.UP
    assert scaler.decide(5, [300, 300], 8) is Decision.HOLD
    assert scaler.decide(5.5, [300, 300], 8) is Decision.HOLD  # back-off after an addition
    assert scaler.decide(6, [300, 300], 8) is Decision.UP


def test_never_more_processes_than_max_or_than_queues() -> None:
    scaler = LagScaler(settings(max_processes=10))
    for t in range(1, 20):
        assert scaler.decide(t, [1000, 1000], 2) is not Decision.UP  # 2 queues, 2 processes
    scaler = LagScaler(settings(max_processes=2))
    for t in range(1, 20):
        assert scaler.decide(t, [1000, 1000], 8) is not Decision.UP


def test_after_the_burst_idle_processes_are_removed_down_to_min_only() -> None:
    scaler = LagScaler(settings(min_processes=1))
    t = 0.0
    for _ in range(5):  # a burst: lag well above the threshold on all three
        t += 1
        scaler.decide(t, [400, 400, 400], 8)
    n = 3
    removals = []
    for _ in range(30):
        t += 1
        if scaler.decide(t, [0] * n, 8) is Decision.DOWN:
            removals.append(t)
            n -= 1
    assert n == 1, "should shrink to MIN and stop there"
    assert len(removals) == 2 and removals[1] - removals[0] >= 2


def test_a_first_removal_with_one_idle_process_still_leads_back_to_min() -> None:
    # The run that flaked in the real-process test: the burst drains unevenly, the first
    # removal happens while only one of three processes is idle, then all go idle. The
    # reference's (n-1)/n over idle processes would zero the integral at that removal
    # and, with no lag left to rebuild it, hold two processes forever.
    scaler = LagScaler(settings(min_processes=1))
    t = 0.0
    for _ in range(5):
        t += 1
        scaler.decide(t, [400, 400, 400], 8)
    lags = [60, 60, 0]
    n = 3
    for _ in range(10):
        t += 1
        if scaler.decide(t, lags, 8) is Decision.DOWN:
            n -= 1
            break
    assert n == 2, "the idle one of three should go first"
    for _ in range(30):
        t += 1
        if scaler.decide(t, [0] * n, 8) is Decision.DOWN:
            n -= 1
    assert n == 1, "all idle after a burst: back to MIN"


def test_processes_with_lag_above_the_idle_threshold_are_never_removed() -> None:
    scaler = LagScaler(settings(min_processes=1))
    for t in range(1, 6):
        scaler.decide(t, [400, 400], 8)
    # Both still have some lag (60 > idle 5) but far below the scale-up threshold: the
    # controller's signal is negative, yet with no idle process nothing may go.
    for t in range(6, 40):
        assert scaler.decide(t, [60, 60], 8) is Decision.HOLD
    # One of them drains: now there is an idle process, and one is removed.
    decisions = [scaler.decide(t, [60, 0], 8) for t in range(40, 50)]
    assert Decision.DOWN in decisions and Decision.UP not in decisions


def test_the_process_removed_is_an_idle_one_never_a_busy_one() -> None:
    # (lag, process number) per child; idle threshold 5.
    assert choose_victim([60, 0, 3], [1, 2, 3], idle_lag=5) == 1  # least lag
    assert choose_victim([0, 60, 0], [1, 2, 3], idle_lag=5) == 2  # tie: the newest
    assert choose_victim([60, 6, 400], [1, 2, 3], idle_lag=5) is None  # none idle


def test_processes_option_and_cli_overrides_for_children() -> None:
    assert parse_processes("2:5") == (2, 5) and parse_processes("3") == (3, 3)
    for bad in ("0:2", "3:2", "a:b", ""):
        with pytest.raises(ValueError):
            parse_processes(bad)
    assert env_for_overrides({"slots": {"count": 16}}) == {"CONVEYOR_SLOTS__COUNT": "16"}


def test_the_clis_log_level_is_the_childrens() -> None:
    # What the child reads its level from (INFO when unset): --log-level, as given.
    assert LOG_LEVEL_ENV == "CONVEYOR_CHILD_LOG_LEVEL"
    assert child_env({"slots": {"count": 16}}, "warning") == {
        "CONVEYOR_SLOTS__COUNT": "16", LOG_LEVEL_ENV: "WARNING"}
    assert child_env({}, None) == {}  # no --log-level: the child's own default, INFO


@pytest.mark.parametrize(("args", "level"), [
    (["--log-level", "warning"], "warning"), (["--log-level", "DEBUG"], "debug"), ([], None),
])
def test_worker_processes_hands_its_log_level_to_the_supervisor(
    monkeypatch: pytest.MonkeyPatch, args: list[str], level: str | None,
) -> None:
    from click.testing import CliRunner

    from conveyor.cli import main
    from conveyor.workers import supervisor as supervisor_package
    from conveyor.workers.daemon import DrainReport

    given: dict[str, object] = {}

    def run_supervisor(*_: object, **kwargs: object) -> DrainReport:
        given.update(kwargs)
        return DrainReport(0, 0, 0, 0, 0)

    monkeypatch.setattr(supervisor_package, "run_supervisor", run_supervisor)
    result = CliRunner().invoke(main, [*args, "worker", "tests.apps.recorder:app",
                                       "--config", "configs/redis.toml", "--processes", "1:2"])
    assert result.exit_code == 0, result.output
    assert given["log_level"] == level


def test_the_memory_adapter_is_refused_with_a_reason() -> None:
    config = load_config(environ={})
    with pytest.raises(ConfigError, match="memory adapter"):
        Supervisor("x:app", "x", config, SupervisorSettings.from_config(config, 1, 2))


def test_a_static_group_member_name_is_refused_for_several_processes() -> None:
    config = load_config(environ={}, overrides={
        "queues": {"adapter": "kafka"}, "balancer": {"kind": "kafka-group"},
        "kafka": {"group_instance_id": "pod-1"},
    })
    with pytest.raises(ConfigError, match=r"\$\.kafka\.group_instance_id: names one daemon"):
        Supervisor("x:app", "x", config, SupervisorSettings.from_config(config, 1, 2))


def test_settings_come_from_the_supervisor_section() -> None:
    config = load_config(environ={"CONVEYOR_SUPERVISOR__LAG_PER_PROCESS": "400"})
    s = SupervisorSettings.from_config(config, 1, 4)
    assert s.lag_per_process == 400 and s.idle_lag_per_process == 20
    assert s.scale_down.inspection_period_s == 0.5


def test_shrinking_reaches_min_even_when_the_first_removal_took_the_only_idle_one() -> None:
    scaler = LagScaler(settings(min_processes=1))
    t = 0.0
    for _ in range(5):
        t += 1
        scaler.decide(t, [400, 400, 400], 8)
    n = 3
    lags = [0, 200, 200]  # one idle, two still draining
    while n == 3 and t < 30:
        t += 1
        if scaler.decide(t, lags[:n], 8) is Decision.DOWN:
            n -= 1
    assert n == 2
    for _ in range(3):  # the rest drains, then nothing is left
        t += 1
        scaler.decide(t, [100] * n, 8)
    for _ in range(30):
        t += 1
        if scaler.decide(t, [0] * n, 8) is Decision.DOWN:
            n -= 1
    assert n == 1


class FlakyLag(MemoryAdapter):
    """A broker whose lag reads fail (as after exhausted retries) until ``healthy``."""

    def __init__(self, lag: int) -> None:
        super().__init__()
        self.healthy = False
        self.reads = 0
        self.value = lag

    async def lag(self, queue: int, group: str) -> int:
        self.reads += 1
        if not self.healthy:
            raise BrokerConnectionError("redis at 127.0.0.1:1 unreachable after 3 attempts")
        return self.value


def supervised_by_hand(telemetry: Telemetry | None = None) -> Supervisor:
    """A supervisor whose one child is taken as started (no process: inspections only)."""
    config = load_config(environ={"CONVEYOR_QUEUES__ADAPTER": "redis",
                                  "CONVEYOR_BALANCER__MEMBERSHIP": "redis"})
    supervisor = Supervisor("x:app", "x", config, settings(), telemetry=telemetry)
    child = ChildProcess(1)
    child.alive = True
    child.queues = set(range(config.queues.total))
    supervisor.children.append(child)
    return supervisor


async def test_a_failing_lag_read_is_logged_and_retried_not_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    supervisor = supervised_by_hand()
    adapter = FlakyLag(lag=7)
    await supervisor.tick(adapter)  # raised out of run() before
    await supervisor.tick(adapter)
    assert supervisor.stats.errors == 2 and supervisor.processes == 1
    assert "inspection failed" in caplog.text and "unreachable" in caplog.text
    assert "Traceback" not in caplog.text  # a ConveyorError is a message, not a trace
    adapter.healthy = True
    await supervisor.tick(adapter)
    total = supervisor.config.queues.total
    assert supervisor.stats.errors == 2 and supervisor.stats.lag == 7 * total
    await adapter.close()


def test_child_gone_is_a_conveyor_error_so_the_cli_prints_a_message() -> None:
    assert issubclass(ChildGone, ConveyorError)


async def test_supervisor_metrics_are_exported() -> None:
    reader = InMemoryMetricReader()
    supervisor = supervised_by_hand(Telemetry(meter_provider=MeterProvider(
        metric_readers=[reader])))
    adapter = FlakyLag(lag=250)
    await supervisor.tick(adapter)  # fails: counted as an error
    adapter.healthy = True
    await supervisor.tick(adapter)
    stats = supervisor.stats
    stats.scale_ups, stats.scale_downs, stats.replaced = 3, 2, 1
    values = metric_values(reader)
    total = supervisor.config.queues.total
    assert values["conveyor.supervisor.processes"] == 1
    assert values["conveyor.supervisor.lag"] == 250 * total
    assert values["conveyor.supervisor.lag_per_process"] == 250 * total
    assert values["conveyor.supervisor.scale_ups"] == 3
    assert values["conveyor.supervisor.scale_downs"] == 2
    assert values["conveyor.supervisor.replaced"] == 1
    assert values["conveyor.supervisor.errors"] == 1
    await adapter.close()
