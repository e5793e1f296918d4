"""`conveyor asyncapi`: the document is valid AsyncAPI 3.0 (the official JSON Schema, in
tests/asyncapi_schema/), every reference in it resolves, and it says what the app and its
config do: a channel per namespace, payload schemas that accept what the handlers decode,
the wire format's headers, the broker's bindings."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from conveyor import load_config
from conveyor.asyncapi import asyncapi_document
from conveyor.platform.config import Config
from tests.apps.asyncapi_app import Line, Order, Refund, Size, app

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "tests" / "asyncapi_schema" / "asyncapi-3.0.0.json"


@cache
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def config(tmp_path: Path, toml: str) -> Config:
    path = tmp_path / "c.toml"
    path.write_text(toml)
    return load_config(path, environ={})


CONFIGS = {
    "memory": "",
    "redis": '[queues]\nadapter = "redis"\ntotal = 16\n'
             '[redis]\nurl = "redis://user:secret@redis.example:6380/2"\nprefix = "shop"\n'
             '[balancer]\nmembership = "redis"\n',
    "sentinel": '[queues]\nadapter = "redis"\n[redis]\nmode = "sentinel"\n'
                'sentinels = ["s1:26379", "s2"]\n[balancer]\nmembership = "redis"\n',
    "kafka": '[queues]\nadapter = "kafka"\ntotal = 12\n'
             '[kafka]\nbootstrap = "k1:9093,k2:9093"\ntopic = "shop-events"\n'
             'replication_factor = 3\nsecurity_protocol = "SASL_SSL"\n',
}


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def payload_validator(doc: dict[str, Any], message: str) -> jsonschema.Validator:
    """A validator of one message's payload, its references resolved in the document."""
    payload = doc["components"]["messages"][message]["payload"]
    resource = Resource.from_contents(doc, default_specification=DRAFT202012)
    registry: Registry[Any] = Registry().with_resource("urn:doc", resource)
    return jsonschema.Draft202012Validator({"$ref": "urn:doc" + payload["$ref"]},
                                           registry=registry)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_the_document_is_valid_asyncapi_3_and_every_reference_resolves(
    tmp_path: Path, kind: str
) -> None:
    doc = asyncapi_document(app, config(tmp_path, CONFIGS[kind]))
    errors = sorted(validator().iter_errors(doc), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:5])
    found = set(refs(doc))
    assert found
    for ref in found:
        resolve(doc, ref)  # a KeyError names a dangling reference


def test_the_validator_refuses_a_broken_document(tmp_path: Path) -> None:
    doc = asyncapi_document(app, config(tmp_path, CONFIGS["kafka"]))
    doc["channels"]["orders"]["bindings"]["kafka"]["partitions"] = 0
    doc["operations"]["audit"]["action"] = "consume"
    paths = {tuple(e.absolute_path) for e in validator().iter_errors(doc)}
    assert paths == {("channels", "orders"), ("operations", "audit")}  # each under a oneOf
    doc["channels"]["orders"]["bindings"]["kafka"]["partitions"] = 12
    doc["operations"]["audit"]["action"] = "receive"
    assert not list(validator().iter_errors(doc))


def test_a_channel_per_namespace_a_message_per_body_type_and_a_receive_per_handler(
    tmp_path: Path,
) -> None:
    doc = asyncapi_document(app, config(tmp_path, CONFIGS["redis"]))
    assert set(doc["channels"]) == {"orders", "events", "blobs", "notes", "refunds"}
    assert set(doc["channels"]["orders"]["messages"]) == {"orders.Order", "orders.Refund"}
    receives = {name: op for name, op in doc["operations"].items() if op["action"] == "receive"}
    assert set(receives) == {"tests.apps.asyncapi_app.on_order", "audit", "refund-check",
                             "tests.apps.asyncapi_app.on_event",
                             "tests.apps.asyncapi_app.on_blob",
                             "tests.apps.asyncapi_app.on_note",
                             "tests.apps.asyncapi_app.on_refunds"}
    assert receives["audit"]["messages"] == [
        {"$ref": "#/channels/orders/messages/orders.Order"}]
    assert receives["tests.apps.asyncapi_app.on_order"]["description"] == (
        "Reserve the stock of each line.")
    assert "Batch handler (up to 50" in receives["tests.apps.asyncapi_app.on_refunds"]["summary"]
    sends = {op["channel"]["$ref"] for op in doc["operations"].values() if op["action"] == "send"}
    assert sends == {f"#/channels/{ns}" for ns in doc["channels"]}
    messages = doc["components"]["messages"]
    assert messages["blobs.bytes"]["contentType"] == "application/octet-stream"
    assert messages["notes.str"]["contentType"] == "text/plain"
    assert messages["events.dict"]["payload"] == {"type": "object"}
    assert messages["refunds.Refund"]["payload"] == {"$ref": "#/components/schemas/Refund"}


def test_payload_schemas_accept_what_the_handlers_decode_and_refuse_what_they_do_not(
    tmp_path: Path,
) -> None:
    doc = asyncapi_document(app, config(tmp_path, CONFIGS["memory"]))
    order = payload_validator(doc, "orders.Order")
    good = Order("o-1", [Line("sku-1", 2, Size.LARGE)], 12.5, note=None)
    order.validate(json.loads(msgspec.json.encode(good)))
    assert doc["components"]["schemas"]["Order"]["description"] == (
        "An order as the shop publishes it.")
    bad = {"id": "o-1", "lines": [{"sku": "x", "quantity": 1, "size": "huge"}], "total": 1}
    with pytest.raises(jsonschema.ValidationError):
        order.validate(bad)
    with pytest.raises(msgspec.ValidationError):  # and the handler's decoder agrees
        msgspec.json.decode(json.dumps(bad), type=Order)
    payload_validator(doc, "refunds.Refund").validate({"order_id": "o-1", "amount": 3.0})
    with pytest.raises(jsonschema.ValidationError):
        payload_validator(doc, "refunds.Refund").validate({"order_id": "o-1"})
    assert Refund  # the batch handler's element type, not list[Refund]


def test_redis_bindings_name_the_streams_and_the_server_without_credentials(
    tmp_path: Path,
) -> None:
    doc = asyncapi_document(app, config(tmp_path, CONFIGS["redis"]))
    assert doc["servers"]["redis"]["host"] == "redis.example:6380"
    assert doc["servers"]["redis"]["pathname"] == "/2"
    assert "secret" not in json.dumps(doc)
    orders = doc["channels"]["orders"]
    assert orders["address"] == "shop:q:{queue}"
    assert "0 to 15" in orders["parameters"]["queue"]["description"]
    headers = doc["components"]["messages"]["orders.Order"]["headers"]
    assert headers["properties"]["cv-ns"]["const"] == "orders"
    assert headers["required"] == ["cv-ns"]
    assert {"cv-key", "cv-id", "content-type", "cv-attempt", "cv-ts", "traceparent",
            "body"} <= set(headers["properties"])


def test_kafka_bindings_give_the_topic_partitions_group_and_record_key(tmp_path: Path) -> None:
    doc = asyncapi_document(app, config(tmp_path, CONFIGS["kafka"]))
    assert doc["servers"]["kafka"] == {
        "host": "k1:9093,k2:9093", "protocol": "kafka-secure",
        "description": "Kafka brokers (SASL_SSL).",
        "bindings": {"kafka": {"bindingVersion": "0.5.0"}},
    }
    orders = doc["channels"]["orders"]
    assert orders["address"] == "shop-events"
    assert orders["bindings"]["kafka"] == {"topic": "shop-events", "partitions": 12,
                                           "replicas": 3, "bindingVersion": "0.5.0"}
    op = doc["operations"]["audit"]
    assert op["bindings"]["kafka"]["groupId"] == {"type": "string", "enum": ["shop"]}
    message = doc["components"]["messages"]["orders.Order"]
    assert message["bindings"]["kafka"]["key"]["type"] == "string"
    assert "required" not in message["headers"]  # a plain Kafka record may omit cv-ns


def test_the_command_writes_json_or_yaml_and_refuses_a_bad_app_path(tmp_path: Path) -> None:
    cfg = tmp_path / "kafka.toml"
    cfg.write_text(CONFIGS["kafka"])

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "conveyor.cli", "asyncapi", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)

    out = tmp_path / "asyncapi.json"
    done = run("tests.apps.asyncapi_app:app", "--config", str(cfg), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert not list(validator().iter_errors(json.loads(out.read_text())))
    done = run("tests/apps/asyncapi_app.py:app", "--config", str(cfg))
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["channels"]["orders"]["address"] == "shop-events"
    done = run("tests.apps.no_such_module:app")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "APP_PATH" in done.stderr


@pytest.mark.parametrize("version", ["", "  "], ids=["empty", "blank"])
def test_an_empty_api_version_is_a_usage_error(tmp_path: Path, version: str) -> None:
    """It was taken: a document with ``info.version: ''``, exit 0."""
    out = tmp_path / "asyncapi.yaml"
    done = subprocess.run([sys.executable, "-m", "conveyor.cli", "asyncapi",
                           "tests.apps.asyncapi_app:app", "--api-version", version, "-o",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "conveyor: error: Invalid value for '--api-version': an empty or blank version "
        "names none (e.g. 1.0.0) (see 'conveyor asyncapi --help')"]
    assert not out.exists()


def test_the_docs_example_runs_as_printed(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "asyncapi.md").read_text()
    app_source = text.split("<!-- runnable: shop.py -->\n```python\n", 1)[1].split("```", 1)[0]
    command = text.split("<!-- runnable: console -->\n```sh\n", 1)[1].split("```", 1)[0]
    (tmp_path / "shop.py").write_text(app_source)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "redis.toml").write_bytes((ROOT / "configs" / "redis.toml")
                                                      .read_bytes())
    args = command.split()
    assert args[0] == "conveyor"
    done = subprocess.run([sys.executable, "-m", "conveyor.cli", *args[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    doc = yaml.safe_load((tmp_path / "asyncapi.yaml").read_text())
    assert not list(validator().iter_errors(doc))
    assert doc["operations"]["shop.reserve_stock"]["description"] == (
        "Reserve the stock of each line.")


def test_every_raw_body_type_is_an_octet_stream_message(tmp_path: Path) -> None:
    """``bytearray``, ``memoryview`` and ``bytes | None`` take the raw body, as ``bytes``
    does: no JSON schema of a base64 string."""
    from conveyor import App

    raw = App("raw")

    @raw.handler("copies")
    async def on_copy(body: bytearray) -> None: ...

    @raw.handler("views")
    async def on_view(body: memoryview) -> None: ...

    @raw.handler("maybe")
    async def on_maybe(body: bytes | None) -> None: ...

    doc = asyncapi_document(raw, config(tmp_path, CONFIGS["redis"]))
    messages = doc["components"]["messages"]
    assert {name: m["contentType"] for name, m in messages.items()} == {
        "copies.bytes": "application/octet-stream", "views.bytes": "application/octet-stream",
        "maybe.bytes": "application/octet-stream"}
    assert doc["components"]["schemas"] == {}
    assert validator().is_valid(doc)


def test_a_partial_handler_is_described_by_the_function_it_calls(tmp_path: Path) -> None:
    """A ``functools.partial`` handler raised TypeError out of ``conveyor asyncapi`` (its
    annotations were read off the partial), and its description would have been
    functools' own docstring of ``partial``."""
    import functools

    from conveyor import App

    app = App("pay")

    async def charge(gateway: str, order: dict[str, int], *, region: str) -> None:
        """Charge an order through a gateway."""

    app.handler("orders")(functools.partial(charge, "stripe", region="eu"))
    doc = asyncapi_document(app, config(tmp_path, CONFIGS["redis"]))
    [operation] = [op for op in doc["operations"].values() if op["action"] == "receive"]
    assert operation["description"] == "Charge an order through a gateway."
    assert list(doc["components"]["messages"]) == ["orders.body"]  # a dict[str, int]
    assert validator().is_valid(doc)
