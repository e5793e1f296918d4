"""A pytest fixture for an app, made by :func:`worker_fixture` (needs pytest, and
pytest-asyncio or anyio to run async tests).

In a ``conftest.py`` or a test module::

    from conveyor.testing.fixtures import worker_fixture
    from shop.app import app

    worker = worker_fixture(app)

    async def test_an_order_is_handled(worker):
        await worker.publish("orders", "o-1", {"total": 3})
        await worker.settle()

Each test gets its own started :class:`~conveyor.testing.TestWorker` (its own private
broker), stopped after the test. No plugin is registered on install: nothing changes in
the test runs of projects that do not ask for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from conveyor.platform.app import App
from conveyor.platform.config import Config
from conveyor.platform.errors import InvalidArgumentError
from conveyor.testing.worker import TestWorker


def worker_fixture(
    app: App, config: Config | None = None, *, name: str = "worker", **options: Any
) -> Callable[..., Any]:
    """A function-scoped async fixture named ``name`` that yields a started
    ``TestWorker(app, config, **options)`` and stops it after the test: as its ``async
    with`` block ends, or, after a test that failed, only stopped.

    It is a ``pytest_asyncio.fixture`` when pytest-asyncio is installed (so it works in
    its strict mode too), else a plain ``pytest.fixture`` for anyio's plugin.
    """
    if not (isinstance(name, str) and name.isidentifier()):  # no test could ask for it
        raise InvalidArgumentError(
            f"worker_fixture name={name!r:.80}: the name a test takes the fixture by, a "
            "Python identifier (name='worker')")
    TestWorker(app, config, **options)  # a bad option fails where the fixture is made

    async def fixture(request: pytest.FixtureRequest) -> AsyncIterator[TestWorker]:
        worker = await TestWorker(app, config, **options).start()
        failed = request.session.testsfailed
        try:
            yield worker
        except BaseException:
            await worker.stop()
            raise
        if request.session.testsfailed > failed:
            # The test failed (pytest counts it before the teardown): only stop, as a
            # block ending in an exception does. Settling and checking here would add
            # an error at its teardown and wait for what the failure left.
            await worker.stop()
        else:
            await worker.__aexit__(None, None, None)

    fixture.__name__ = fixture.__qualname__ = name
    fixture.__doc__ = f"A started conveyor.testing.TestWorker of app {app.name!r}."
    try:
        import pytest_asyncio
    except ImportError:
        return pytest.fixture(name=name)(fixture)
    return pytest_asyncio.fixture(name=name)(fixture)
