"""The Kafka tests share the session's tansu broker (``tansu``, tests/servers/tansu.py) and
isolate themselves by topic and group names."""

from __future__ import annotations

import uuid

import pytest

# Re-exported for the tests here.
from tests.servers import Tansu as Tansu
from tests.servers import start_tansu as start_tansu
from tests.servers import tansu_binary as tansu_binary


@pytest.fixture
def topic() -> str:
    """A fresh topic name per test (the broker is shared by the session)."""
    return f"t-{uuid.uuid4().hex[:10]}"
