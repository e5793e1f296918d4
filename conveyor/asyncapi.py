"""An AsyncAPI 3.0 document of an app: ``conveyor asyncapi APP_PATH --config FILE``.

What the document says, from the app and its config (nothing is asked of a broker):

* **servers** — the Redis server or the Kafka brokers of the config (no credentials);
  none for the embedded memory adapter, which lives inside the worker's process.
* **channels** — one per namespace the app handles. Its address is where the namespace's
  messages live: the Kafka topic, or the Redis streams ``PREFIX:q:{queue}``; a namespace
  shares them with every other namespace (the ``cv-ns`` header tells them apart) and a
  stream key always maps to the same queue (the hash ring), which is what keeps one key's
  messages in order.
* **messages** — one per body type a namespace's handlers decode, its payload schema from
  the handler's first parameter (``msgspec.json.schema``: a Struct, ``dict``, ``list``;
  ``bytes``, ``bytearray``, ``memoryview`` and ``str`` are raw bodies), its headers the
  wire format's (:mod:`conveyor.platform.message`), with the Kafka binding's record key
  (the stream key).
* **operations** — ``receive`` per handler (the consumer group is the app's name) and a
  ``send`` per namespace for producers.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import msgspec

from conveyor.platform.app import App
from conveyor.platform.config import Config
from conveyor.platform.handlers import HandlerSpec, handler_function, raw_or_text
from conveyor.platform.message import (
    CONTENT_BYTES,
    CONTENT_JSON,
    CONTENT_TEXT,
    H_ATTEMPT,
    H_CONTENT_TYPE,
    H_ENQUEUED_MS,
    H_ID,
    H_KEY,
    H_NAMESPACE,
    H_REPLAY_OF,
    H_TRACEPARENT,
    H_TRACESTATE,
)

ASYNCAPI_VERSION = "3.0.0"
KAFKA_BINDING = "0.5.0"
REDIS_BINDING = "0.1.0"
REDIS_BODY_FIELD = "body"
"""The stream-entry field that holds the body (``conveyor.adapters.redis.codec.F_BODY``)."""

_ID_UNSAFE = re.compile(r"[^\w.\-]")


def asyncapi_document(app: App, config: Config, *, api_version: str = "1.0.0") -> dict[str, Any]:
    """The AsyncAPI 3.0 document of ``app`` deployed with ``config``, as plain data (dump it
    as JSON or YAML)."""
    adapter = config.queues.adapter
    bodies = {spec.name: _body_type(spec) for spec in app.handlers}
    schemas, refs = _schemas(bodies.values())
    channels: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for namespace, specs in app.subscriptions().items():
        channel_messages: dict[str, Any] = {}
        for spec in specs:
            body = bodies[spec.name]
            name = _message_name(namespace, body)
            if name not in messages:
                messages[name] = _message(namespace, body, refs, adapter)
                channel_messages[name] = {"$ref": f"#/components/messages/{name}"}
            operations[_safe_id(spec.name)] = _receive(namespace, name, spec, app.name,
                                                       adapter)
        channels[namespace] = _channel(namespace, channel_messages, config)
        operations[_safe_id(f"publish.{namespace}")] = {
            "action": "send",
            "channel": {"$ref": f"#/channels/{namespace}"},
            "summary": f"Publish to namespace {namespace!r} (Client.publish or any client "
                       "of the broker, with the headers below).",
            "messages": [{"$ref": f"#/channels/{namespace}/messages/{m}"}
                         for m in channel_messages],
        }
    doc: dict[str, Any] = {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": app.name,
            "version": api_version,
            "description": _info_description(app, config),
        },
        "defaultContentType": CONTENT_JSON,
    }
    servers = _servers(config)
    if servers:
        doc["servers"] = servers
    doc["channels"] = channels
    doc["operations"] = operations
    doc["components"] = {"messages": messages, "schemas": schemas}
    return doc


def _body_type(spec: HandlerSpec) -> Any:
    """What the handler's first parameter decodes each body into (a batch handler's
    ``list[T]``: ``T``), as the declaration checked it."""
    params = list(inspect.signature(spec.fn).parameters.values())
    body = typing.get_type_hints(handler_function(spec.fn))[params[0].name]
    if spec.batch is not None:
        body = typing.get_args(body)[0]
    body = raw_or_text(body)
    return bytes if body in (bytearray, memoryview) else body  # the raw body, as bytes


def _schemas(bodies: Iterable[Any]) -> tuple[dict[str, Any], dict[Any, Any]]:
    """(components/schemas, body type -> its payload schema) for the JSON-decoded bodies."""
    decoded = [t for t in dict.fromkeys(bodies) if t not in (bytes, str)]
    found, components = msgspec.json.schema_components(
        decoded, ref_template="#/components/schemas/{name}")
    return dict(components), dict(zip(decoded, found, strict=True))


def _message_name(namespace: str, body: Any) -> str:
    kind = getattr(body, "__name__", None) if isinstance(body, type) else None
    return _safe_id(f"{namespace}.{kind or 'body'}")


def _safe_id(name: str) -> str:
    """A component or operation id AsyncAPI accepts (letters, digits, ``.-_``)."""
    return _ID_UNSAFE.sub("_", name)


def _message(namespace: str, body: Any, refs: dict[Any, Any], adapter: str) -> dict[str, Any]:
    if body is bytes:
        content_type, payload = CONTENT_BYTES, {"type": "string", "format": "binary"}
    elif body is str:
        content_type, payload = CONTENT_TEXT, {"type": "string"}
    else:
        content_type, payload = CONTENT_JSON, refs[body]
    message: dict[str, Any] = {
        "name": _message_name(namespace, body),
        "title": f"{namespace}: {getattr(body, '__name__', str(body))}",
        "contentType": content_type,
        "headers": _headers(namespace, adapter),
        "payload": payload,
        "correlationId": {"description": "The message id, kept across retries and "
                                         "dead-lettering.",
                          "location": f"$message.header#/{H_ID}"},
    }
    if content_type == CONTENT_JSON:
        message["description"] = ("JSON by default; the same fields in msgpack when "
                                  "content-type is application/msgpack.")
    if adapter == "kafka":
        message["bindings"] = {"kafka": {
            "key": {"type": "string", "description": "The stream key: one key's messages "
                    "are handled in order, one at a time."},
            "bindingVersion": KAFKA_BINDING,
        }}
    return message


def _headers(namespace: str, adapter: str) -> dict[str, Any]:
    """The wire format's metadata (Kafka record headers, Redis stream-entry fields)."""
    text = {"type": "string"}
    digits = {"type": "string", "pattern": "^[0-9]+$"}
    properties: dict[str, Any] = {
        H_NAMESPACE: {**text, "const": namespace,
                      "description": "The namespace: selects the handlers."},
        H_KEY: {**text, "description": "The stream key (on Kafka the record key carries it)."},
        H_ID: {**text, "description": "Message id; default: the Redis entry id, or "
                                      "TOPIC-PARTITION-OFFSET on Kafka."},
        H_CONTENT_TYPE: {**text, "description": "application/json (default), "
                                                "application/msgpack, text/plain, ..."},
        H_ATTEMPT: {**digits, "description": "Deliveries that failed before (default 0)."},
        H_ENQUEUED_MS: {**digits, "description": "Enqueue time, ms since the epoch."},
        H_TRACEPARENT: {**text, "description": "W3C trace context."},
        H_TRACESTATE: {**text, "description": "W3C trace state."},
        H_REPLAY_OF: {**text, "description": "Set on a message replayed from a dead letter: "
                                             "the letter's id."},
    }
    if adapter == "redis":
        properties[REDIS_BODY_FIELD] = {"description": "The body (the payload below), "
                                                       "as one more field of the entry."}
    return {
        "type": "object",
        "description": "Metadata beside the body; other names are user headers. On Kafka "
                       "these are record headers; on Redis, fields of the stream entry.",
        "properties": properties,
        "additionalProperties": text,
        **({} if adapter == "kafka" else {"required": [H_NAMESPACE]}),
    }


def _receive(namespace: str, message: str, spec: HandlerSpec, group: str,
             adapter: str) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "action": "receive",
        "channel": {"$ref": f"#/channels/{namespace}"},
        "title": spec.name,
        "messages": [{"$ref": f"#/channels/{namespace}/messages/{message}"}],
    }
    doc = inspect.getdoc(handler_function(spec.fn))  # a partial's is functools' own
    if doc:
        operation["description"] = doc
    batch = spec.batch
    operation["summary"] = (f"Batch handler (up to {batch.size} messages a call)"
                            if batch is not None else "Handler") + f" of consumer group {group!r}"
    if adapter == "kafka":
        operation["bindings"] = {"kafka": {"groupId": {"type": "string", "enum": [group]},
                                           "bindingVersion": KAFKA_BINDING}}
    return operation


def _channel(namespace: str, messages: dict[str, Any], config: Config) -> dict[str, Any]:
    total = config.queues.total
    order = (f"A stream key maps to one of {total} queues on a hash ring (the same in every "
             "producer and worker), so one key's messages are handled in order.")
    channel: dict[str, Any] = {"address": None, "title": namespace}
    adapter = config.queues.adapter
    if adapter == "kafka":
        kafka = config.kafka
        channel["address"] = kafka.topic
        channel["description"] = (f"Namespace {namespace!r} on topic {kafka.topic!r}: "
                                  f"partition N is queue N. {order}")
        channel["bindings"] = {"kafka": {
            "topic": kafka.topic, "partitions": total, "replicas": kafka.replication_factor,
            "bindingVersion": KAFKA_BINDING,
        }}
    elif adapter == "redis":
        channel["address"] = f"{config.redis.prefix}:q:{{queue}}"
        channel["description"] = (f"Namespace {namespace!r} in the Redis streams "
                                  f"{config.redis.prefix}:q:0 .. {total - 1}, one per queue. "
                                  f"{order}")
        channel["parameters"] = {"queue": {
            "description": f"The queue, 0 to {total - 1}: hash-ring position of "
                           "(namespace, stream key).",
            "examples": ["0", str(total - 1)],
        }}
        channel["bindings"] = {"redis": {"bindingVersion": REDIS_BINDING}}
    else:
        channel["description"] = (f"Namespace {namespace!r} on the embedded (in-process) "
                                  f"adapter. {order}")
    channel["messages"] = messages
    return channel


def _servers(config: Config) -> dict[str, Any]:
    adapter = config.queues.adapter
    if adapter == "redis":
        url = urlsplit(config.redis.url)
        host = url.hostname or "127.0.0.1"
        server: dict[str, Any] = {
            "host": f"{host}:{url.port or 6379}",
            "protocol": url.scheme or "redis",
            "description": f"Redis ({config.redis.mode}); every key starts with "
                           f"{config.redis.prefix!r}.",
            "bindings": {"redis": {"bindingVersion": REDIS_BINDING}},
        }
        if config.redis.mode == "sentinel":
            server["host"] = ",".join(config.redis.sentinels)
            server["description"] += f" Sentinels monitoring {config.redis.sentinel_service!r}."
        elif url.path not in ("", "/"):
            server["pathname"] = url.path
        return {"redis": server}
    if adapter == "kafka":
        kafka = config.kafka
        secure = kafka.security_protocol in ("SSL", "SASL_SSL")
        return {"kafka": {
            "host": kafka.bootstrap,
            "protocol": "kafka-secure" if secure else "kafka",
            "description": f"Kafka brokers ({kafka.security_protocol}).",
            "bindings": {"kafka": {"bindingVersion": KAFKA_BINDING}},
        }}
    return {}


def _info_description(app: App, config: Config) -> str:
    where = {"redis": "Redis streams", "kafka": "a Kafka topic",
             "memory": "the embedded in-process adapter"}[config.queues.adapter]
    return (f"Conveyor app {app.name!r} on {where}: at least once, in order per stream key. "
            "Metadata travels beside the body (headers below), so any client of the broker "
            "can publish and consume.")


def dump(document: dict[str, Any], fmt: str) -> str:
    """``document`` as ``json`` or ``yaml`` text."""
    if fmt == "json":
        return msgspec.json.format(msgspec.json.encode(document), indent=2).decode() + "\n"
    import yaml

    return str(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
