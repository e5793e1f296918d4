"""The OpenTelemetry resource of a Conveyor process, hashed once.

The OTLP exporters group what they export by resource, a dict lookup per span: the
SDK's ``Resource.__hash__`` serialises every attribute to JSON on each call (about
3 µs, paid for every exported span in the export thread, which holds the GIL). A
resource never changes once built, so its hash is computed once.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.sdk.resources import Resource


class HashedResource(Resource):
    """A copy of ``resource`` whose hash is computed when it is built; equal to (and
    hashed like) the original."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


def create_resource(attributes: Mapping[str, str]) -> Resource:
    """``Resource.create(attributes)`` (the SDK's detectors and ``OTEL_*`` merged in),
    hashed once."""
    return HashedResource(Resource.create(dict(attributes)))
