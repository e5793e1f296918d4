"""`conveyor deploy kubernetes`'s rendering, offline: the core objects validate against
the Kubernetes schemas (kubernetes-validate ships them) and every field that carries a
name or a number comes from the config. The names' match with what a real daemon uses
is checked on real brokers in tests/integration/{redis,kafka}/test_*_deploy.py."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner, Result

from conveyor.adapters.redis.keys import Keys
from conveyor.cli import main
from conveyor.cli.common import USAGE_ERROR
from conveyor.cli.deploy import to_yaml
from conveyor.deploy import kubernetes as k8s
from conveyor.platform.config import Config, load_config
from conveyor.platform.errors import ConfigError, InvalidArgumentError
from conveyor.version import version
from conveyor.workers.serve import STOP_GRACE_S

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]


def config(adapter: str, **sections: dict[str, Any]) -> Config:
    base: dict[str, dict[str, Any]] = {"queues": {"adapter": adapter, "total": 4}}
    if adapter == "redis":
        base["redis"] = {"url": "redis://redis.data:6380/2", "prefix": "shopq"}
        base["balancer"] = {"kind": "dynamic", "membership": "redis"}
    if adapter == "kafka":
        base["kafka"] = {"bootstrap": "kafka-0.kafka:9092,kafka-1.kafka:9092",
                         "topic": "orders-topic"}
        base["balancer"] = {"kind": "kafka-group"}
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return load_config(None, environ={}, overrides=base)


def options(**changes: Any) -> k8s.Options:
    values: dict[str, Any] = {"app_path": "shop:app", "app_name": "Shop_App.v2",
                              "config_text": "[queues]\nadapter = \"redis\"\n",
                              "image": "registry.example/shop:1"}
    values.update(changes)
    return k8s.Options(**values)


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = [o["kind"] for o in objects]
    assert len(set(kinds)) == len(kinds), kinds
    return {o["kind"]: o for o in objects}


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [c] = by_kind(objects)["Deployment"]["spec"]["template"]["spec"]["containers"]
    return c


@pytest.mark.parametrize("adapter", ["redis", "kafka"])
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_core_objects_validate_against_the_kubernetes_schemas(
    adapter: str, version: str
) -> None:
    cfg = config(adapter, kafka={"security_protocol": "SASL_SSL"} if adapter == "kafka" else {})
    objects = k8s.render(cfg, options(namespace="workers"))
    # Through YAML and back, as kubectl would read them.
    parsed = list(yaml.safe_load_all(to_yaml(objects)))
    assert parsed == objects
    core = [o for o in parsed if o["apiVersion"] in ("v1", "apps/v1")]
    assert [o["kind"] for o in core] == ["ConfigMap", "Deployment"]
    for obj in core:
        kubernetes_validate.validate(obj, version, strict=True)
    assert all(o["metadata"]["namespace"] == "workers" for o in parsed)


def test_a_wrong_field_fails_the_schema_check() -> None:
    """The validation above can fail: a misspelt field or a number as text is caught."""
    deployment = by_kind(k8s.render(config("redis"), options()))["Deployment"]
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 10
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)
    deployment = by_kind(k8s.render(config("redis"), options()))["Deployment"]
    deployment["spec"]["replicas"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)


def test_the_pods_run_the_config_file_as_given_with_probes_on_the_http_port() -> None:
    text = (ROOT / "configs" / "redis.toml").read_text()
    objects = k8s.render(config("redis"), options(config_text=text, http_port=9100))
    kinds = by_kind(objects)
    assert kinds["ConfigMap"]["data"] == {"conveyor.toml": text}
    assert kinds["ConfigMap"]["metadata"]["name"] == "shop-app-v2-config"
    c = container(objects)
    assert c["image"] == "registry.example/shop:1"
    assert c["args"] == ["worker", "shop:app", "--config", "/etc/conveyor/conveyor.toml",
                         "--http-port", "9100"]
    assert c["ports"] == [{"name": "http", "containerPort": 9100, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    [config_volume] = [v for v in pod["volumes"] if v["name"] == "config"]
    assert config_volume["configMap"]["name"] == kinds["ConfigMap"]["metadata"]["name"]
    assert {"name": "config", "mountPath": "/etc/conveyor", "readOnly": True} \
        in c["volumeMounts"]
    # Credentials come from the environment as on one machine: a Secret the user makes.
    assert c["envFrom"] == [{"secretRef": {"name": "shop-app-v2-secrets", "optional": True}}]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == k8s.RUN_AS_USER != 0
    assert c["resources"]["requests"] == {"cpu": "500m", "memory": "512Mi"}
    labels = kinds["Deployment"]["spec"]["selector"]["matchLabels"]
    assert labels.items() <= kinds["Deployment"]["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("drain_s", [0.0, 30.0, 12.5, 600.0])
def test_the_grace_period_outlasts_the_drain_and_the_stop_after_it(drain_s: float) -> None:
    cfg = config("redis", worker={"drain_timeout_s": drain_s})
    pod = by_kind(k8s.render(cfg, options()))["Deployment"]["spec"]["template"]["spec"]
    grace = pod["terminationGracePeriodSeconds"]
    assert isinstance(grace, int)
    assert grace >= drain_s + STOP_GRACE_S + k8s.GRACE_MARGIN_S
    assert grace < drain_s + STOP_GRACE_S + k8s.GRACE_MARGIN_S + 1


def test_redis_scales_on_every_queue_streams_lag_and_pending_entries_summed() -> None:
    cfg = config("redis", supervisor={"lag_per_process": 250})
    scaled = by_kind(k8s.render(cfg, options(replicas=2)))["ScaledObject"]
    spec = scaled["spec"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert spec["scaleTargetRef"]["name"] == "shop-app-v2-worker"
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 4)
    # KEDA owns the count: a re-apply must not reset it.
    assert "replicas" not in by_kind(k8s.render(cfg, options(replicas=2)))["Deployment"]["spec"]
    triggers = spec["triggers"]
    assert len(triggers) == 2 * 4
    keys = Keys("shopq")
    for queue in range(4):
        lag, pending = triggers[2 * queue], triggers[2 * queue + 1]
        for trigger in (lag, pending):
            assert trigger["type"] == "redis-streams"
            meta = trigger["metadata"]
            assert meta["stream"] == keys.queue(queue) == f"shopq:q:{queue}"
            assert meta["consumerGroup"] == "Shop_App.v2"  # the app's name, unchanged
            assert meta["address"] == "redis.data:6380"
            assert meta["databaseIndex"] == "2"
            assert meta["passwordFromEnv"] == "CONVEYOR_REDIS_PASSWORD"
            assert meta["usernameFromEnv"] == "CONVEYOR_REDIS_USERNAME"
            assert "enableTLS" not in meta
        assert lag["metadata"]["lagCount"] == "250" and "pendingEntriesCount" not in lag
        assert pending["metadata"]["pendingEntriesCount"] == "250"
        assert "lagCount" not in pending["metadata"]
    modifiers = spec["advanced"]["scalingModifiers"]
    names = [t["name"] for t in triggers]
    assert len(set(names)) == len(names)
    assert sorted(modifiers["formula"].split(" + ")) == sorted(names)
    assert modifiers["target"] == "250" and modifiers["metricType"] == "AverageValue"


def test_a_redis_cluster_scales_with_kedas_cluster_scaler_on_any_node() -> None:
    cfg = config("redis", redis={"mode": "cluster", "url": "redis://redis-0.data:7000"})
    triggers = by_kind(k8s.render(cfg, options()))["ScaledObject"]["spec"]["triggers"]
    assert {t["type"] for t in triggers} == {"redis-cluster-streams"}
    for trigger in triggers:
        meta = trigger["metadata"]
        assert meta["addresses"] == "redis-0.data:7000"
        assert "address" not in meta and "databaseIndex" not in meta
    assert triggers[0]["metadata"]["stream"] == Keys("shopq", cluster=True).queue(0)


def test_a_sentinel_config_scales_with_kedas_sentinel_scaler_asking_the_same_sentinels() -> None:
    cfg = config("redis", redis={
        "mode": "sentinel", "url": "rediss:///3", "sentinel_service": "orders",
        "sentinels": ["s-0.data:26379", "s-1.data"],
        "sentinel_password_env": "SENTINEL_PW"})
    triggers = by_kind(k8s.render(cfg, options()))["ScaledObject"]["spec"]["triggers"]
    assert {t["type"] for t in triggers} == {"redis-sentinel-streams"}
    for trigger in triggers:
        meta = trigger["metadata"]
        assert meta["addresses"] == "s-0.data:26379,s-1.data"
        assert (meta["sentinelMaster"], meta["databaseIndex"]) == ("orders", "3")
        assert meta["sentinelPasswordFromEnv"] == "SENTINEL_PW"
        assert "sentinelUsernameFromEnv" not in meta and "address" not in meta
        assert meta["enableTLS"] == "true"
        assert meta["passwordFromEnv"] == "CONVEYOR_REDIS_PASSWORD"  # the data nodes'
    assert triggers[0]["metadata"]["stream"] == Keys("shopq").queue(0)
    # The url's host is not used: the sentinels' are what a pod must reach.
    assert k8s.warnings(cfg) == []
    local = config("redis", redis={"mode": "sentinel", "url": "redis://127.0.0.1/0",
                                   "sentinels": ["s-0.data", "[::1]:26380"]})
    assert k8s.warnings(local) == [
        "$.redis.sentinels points at [::1]: inside a pod that is the pod itself"]


@pytest.mark.parametrize(("url", "address", "db"), [
    ("redis://cache", "cache:6379", "0"),
    ("redis://cache:7000?db=5", "cache:7000", "5"),
    ("redis://[::1]:7001/3", "[::1]:7001", "3"),
])
def test_the_redis_address_and_database_are_read_as_the_client_reads_the_url(
    url: str, address: str, db: str
) -> None:
    [trigger, *_] = by_kind(k8s.render(config("redis", redis={"url": url}), options())
                            )["ScaledObject"]["spec"]["triggers"]
    assert (trigger["metadata"]["address"], trigger["metadata"]["databaseIndex"]) == (address, db)


def test_redis_over_tls_says_so_to_keda() -> None:
    cfg = config("redis", redis={"url": "rediss://cache.example:6390"})
    [trigger, *_] = by_kind(k8s.render(cfg, options()))["ScaledObject"]["spec"]["triggers"]
    assert trigger["metadata"]["enableTLS"] == "true"
    assert trigger["metadata"]["address"] == "cache.example:6390"
    assert trigger["metadata"]["databaseIndex"] == "0"


def test_kafka_scales_on_the_apps_consumer_group_lag_on_its_topic() -> None:
    cfg = config("kafka", supervisor={"lag_per_process": 40})
    objects = k8s.render(cfg, options())
    assert "TriggerAuthentication" not in by_kind(objects)
    spec = by_kind(objects)["ScaledObject"]["spec"]
    [trigger] = spec["triggers"]
    assert trigger["type"] == "kafka"
    assert trigger["metadata"] == {
        "bootstrapServers": "kafka-0.kafka:9092,kafka-1.kafka:9092",
        "consumerGroup": "Shop_App.v2",
        "topic": "orders-topic",
        "lagThreshold": "40",
        "offsetResetPolicy": "earliest",
    }
    assert "advanced" not in spec
    assert spec["maxReplicaCount"] == 4  # partitions: a pod past them owns nothing
    assert "env" not in container(objects)


@pytest.mark.parametrize(("mechanism", "keda"), [("PLAIN", "plaintext"),
                                                 ("SCRAM-SHA-256", "scram_sha256"),
                                                 ("SCRAM-SHA-512", "scram_sha512")])
def test_kafka_sasl_credentials_reach_keda_from_the_workers_environment(
    mechanism: str, keda: str, tmp_path: Path
) -> None:
    cfg = config("kafka", kafka={"security_protocol": "SASL_SSL", "sasl_mechanism": mechanism,
                                 "sasl_username": "svc-shop",
                                 "sasl_password_env": "SHOP_KAFKA_PASSWORD"})
    objects = k8s.render(cfg, options())
    kinds = by_kind(objects)
    [trigger] = kinds["ScaledObject"]["spec"]["triggers"]
    assert trigger["metadata"]["sasl"] == keda and trigger["metadata"]["tls"] == "enable"
    auth = kinds["TriggerAuthentication"]
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    env = {e["parameter"]: e for e in auth["spec"]["env"]}
    assert env["password"]["name"] == "SHOP_KAFKA_PASSWORD"
    assert env["username"]["name"] == k8s.KAFKA_USERNAME_ENV
    assert {e["containerName"] for e in env.values()} == {container(objects)["name"]}
    # The username variable the pod gets is the config's own value: the worker reads it
    # as an override of that very field, so nothing changes for it.
    assert container(objects)["env"] == [{"name": k8s.KAFKA_USERNAME_ENV, "value": "svc-shop"}]
    file = tmp_path / "c.toml"
    file.write_text('[kafka]\nsasl_username = "from-file"\n')
    seen = load_config(file, environ={k8s.KAFKA_USERNAME_ENV: "svc-shop"})
    assert seen.kafka.sasl_username == "svc-shop"
    assert [o["kind"] for o in objects] == ["ConfigMap", "Deployment",
                                            "TriggerAuthentication", "ScaledObject"]


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        (lambda: config("memory"), "$.queues.adapter"),
        (lambda: config("redis", balancer={"kind": "static"}), "$.balancer.kind"),
        (lambda: config("kafka", balancer={"kind": "static"}), "$.balancer.kind"),
        (lambda: config("kafka", balancer={"kind": "dynamic", "membership": "memory"}),
         "$.balancer.membership"),
        (lambda: config("redis", queues={"total": k8s.MAX_REDIS_QUEUES + 1}),
         "$.queues.total"),
    ],
)
def test_configs_whose_daemons_cannot_share_work_across_pods_are_refused(
    cfg: Any, field: str
) -> None:
    with pytest.raises(ConfigError, match=field.replace("$", r"\$")):
        k8s.render(cfg(), options())


def test_the_memory_adapter_is_refused_because_it_cannot_span_pods() -> None:
    with pytest.raises(ConfigError, match="cannot span pods"):
        k8s.render(config("memory"), options())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_replicas": 5}, "exceeds \\[queues\\] total = 4"),
        ({"replicas": 3, "max_replicas": 2}, "--replicas 3 exceeds"),
        ({"app_path": "/home/me/shop.py:app"}, "outside the image's /app"),
        ({"app_path": "../shop.py:app"}, "outside the image's /app"),
        ({"app_name": "___"}, "no letter or digit"),
    ],
)
def test_bad_arguments_are_refused_with_what_to_do(changes: dict[str, Any],
                                                   message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        k8s.render(config("redis"), options(**changes))


def test_object_names_are_dns_labels_made_of_the_app_name() -> None:
    assert k8s.object_name("shop") == "shop"
    assert k8s.object_name("Shop_App.v2") == "shop-app-v2"
    assert len(k8s.object_name("a" * 128)) <= 50


def test_loopback_brokers_and_passwords_in_the_file_are_warned_about() -> None:
    assert k8s.warnings(config("redis")) == []
    assert any("[::1]" in w for w in k8s.warnings(config("redis", redis={
        "url": "redis://[::1]:6379"})))
    local = config("redis", redis={"url": "redis://u:secret@127.0.0.1:6379/0"})
    found = k8s.warnings(local)
    assert any("127.0.0.1" in w for w in found)
    assert any("password" in w and "CONVEYOR_REDIS_PASSWORD" in w for w in found)
    assert all("secret" not in w for w in found)
    assert any("localhost" in w for w in k8s.warnings(config("kafka", kafka={
        "bootstrap": "localhost:9092"})))


@pytest.mark.parametrize("text", [
    "[queues]\nadapter = \"redis\"   \n",            # trailing spaces: no literal block
    "# ---\n---\n...\n[redis]\nprefix = \"é\"\n",     # document markers, non-ASCII
    "[worker]\n\tdrain_timeout_s = 5\n\n\n",          # tabs, blank lines at the end
    "no newline at the end",
])
def test_the_config_file_survives_yaml_byte_for_byte(text: str) -> None:
    objects = k8s.render(config("redis"), options(config_text=text))
    [parsed, *_] = yaml.safe_load_all(to_yaml(objects))
    assert parsed["data"]["conveyor.toml"] == text


def test_certificate_files_the_pods_need_are_warned_about() -> None:
    cfg = config("kafka", kafka={"security_protocol": "SSL",
                                 "ssl_cafile": "/etc/ssl/kafka-ca.pem"})
    [warning] = k8s.warnings(cfg)
    assert warning.startswith("$.kafka.ssl_cafile names /etc/ssl/kafka-ca.pem")
    # Another adapter's files are not this deployment's concern.
    assert k8s.warnings(config("redis", kafka={"ssl_cafile": "/x.pem"})) == []


@pytest.mark.parametrize("adapter", ["redis", "kafka"])
def test_keda_fields_are_text_where_the_crd_wants_text(adapter: str) -> None:
    """KEDA's CRD types trigger metadata as a map of strings (a bare 250 is refused by
    the API server) and the scalingModifiers' target likewise."""
    cfg = config(adapter, kafka={"security_protocol": "SASL_SSL"} if adapter == "kafka" else {})
    spec = by_kind(k8s.render(cfg, options()))["ScaledObject"]["spec"]
    for trigger in spec["triggers"]:
        assert all(isinstance(v, str) for v in trigger["metadata"].values()), trigger
    for value in spec.get("advanced", {}).get("scalingModifiers", {}).values():
        assert isinstance(value, str)
    for field in ("minReplicaCount", "maxReplicaCount", "pollingInterval", "cooldownPeriod"):
        assert isinstance(spec[field], int)


DIGEST = "sha256:" + "0123456789abcdef" * 4


def deploy_cli(image: str) -> Result:
    return CliRunner().invoke(main, ["deploy", "kubernetes", "--app", "tests.apps.recorder:app",
                                     "--config", "configs/redis.toml", "--image", image])


@pytest.mark.parametrize("image", [
    "", " ", "a b", "shop\n", "shop\x00", "shop\t1", "Shop:1", "shop:", "shop:-1", "/shop",
    "shop/", "shop//x", "shop..x", "-shop", "registry:port/shop", "shop:1:2",
    "https://registry.example/shop", "shop@sha256:abc", "shop@" + DIGEST.upper(),
    "shop:" + "t" * 129, "r.example/" + "x" * 250,
])
def test_an_image_that_is_no_image_reference_is_a_usage_error(image: str) -> None:
    # Written into the Deployment as given, the pods could never pull it; '' became the
    # default image.
    result = deploy_cli(image)
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: Invalid value for '--image': "), line
    assert "is not an image reference" in line
    assert result.stdout == ""


@pytest.mark.parametrize("image", [
    "shop", "shop:1.4", "registry.example.com/shop:1.4",
    "registry.example.com:5000/team/shop:1.4", "localhost:5000/shop",
    "ghcr.io/org/my-app_x.y__z:v1.0-RC_1", "[::1]:5000/shop:1", f"shop@{DIGEST}",
    f"registry.example/shop:1.4@{DIGEST}", "docker.io/library/python:3.11-slim",
])
def test_an_image_reference_goes_into_the_deployment_as_given(image: str) -> None:
    result = deploy_cli(image)
    assert result.exit_code == 0, result.stderr
    assert container(list(yaml.safe_load_all(result.stdout)))["image"] == image


def test_without_image_the_deployment_runs_this_versions_image() -> None:
    result = CliRunner().invoke(main, ["deploy", "kubernetes", "--app",
                                       "tests.apps.recorder:app", "--config",
                                       "configs/redis.toml"])
    assert result.exit_code == 0, result.stderr
    assert container(list(yaml.safe_load_all(result.stdout)))["image"] == (
        f"conveyor:{version()}")


def test_a_record_naming_other_files_makes_a_render_remove_none_of_them(
        tmp_path: Path) -> None:
    """The record is a file in the operator's directory: whatever it says, only names a
    render writes (NN-kind.yaml) are ever removed, and only with the recorded digest."""
    from conveyor.deploy import output_dir

    out = tmp_path / "k8s"
    out.mkdir()
    (tmp_path / "outside.yaml").write_text("x\n")
    for name in ("README.md", "kustomization.yaml", "04-scaledobject.yaml"):
        (out / name).write_text("x\n")
    digest = hashlib.sha256(b"x\n").hexdigest()
    (out / output_dir.RECORD).write_text("".join(
        f"{digest}  {name}\n" for name in ("README.md", "../outside.yaml",
                                           "kustomization.yaml", "03-scaledobject.yaml")))
    (out / "03-scaledobject.yaml").write_text("edited\n")  # digest no longer recorded
    with pytest.raises(output_dir.NotOursError, match=r"03-scaledobject\.yaml, written by an"):
        output_dir.plan(out, {"01-configmap.yaml": b"a\n"})
    (out / "03-scaledobject.yaml").write_text("x\n")
    plan = output_dir.plan(out, {"01-configmap.yaml": b"a\n"})
    assert plan.stale == ["03-scaledobject.yaml"]
    assert output_dir.carry_out(plan) == [out / "03-scaledobject.yaml"]
    assert sorted(p.name for p in out.iterdir()) == [
        output_dir.RECORD, "01-configmap.yaml", "04-scaledobject.yaml", "README.md",
        "kustomization.yaml"]
    assert (tmp_path / "outside.yaml").exists()
    assert output_dir.read_record(out) == {
        "01-configmap.yaml": hashlib.sha256(b"a\n").hexdigest()}
