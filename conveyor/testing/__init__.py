"""Test an app's handlers in-process, through the real worker daemon.

:class:`TestWorker` starts the app's real :class:`~conveyor.WorkerDaemon` — pulling
agents, slots, the delivery chain with decode, retry, dead letters, idempotency, the
app's interceptors, pools, cells and batch handlers, startup hooks — on a private
embedded broker. A test publishes, awaits :meth:`TestWorker.settle` (which returns once
everything published so far is acknowledged, or names what is not), then reads the
:class:`Record` of each message: handled, retried, dead-lettered, skipped or
deduplicated, with its body, its attempts and their exceptions.

:func:`conveyor.testing.fixtures.worker_fixture` makes a pytest fixture of it. The user
manual is docs/testing.md.
"""

from conveyor.testing.observe import BatchCall
from conveyor.testing.records import (
    Attempt,
    DeadLettersFound,
    NotSettled,
    Outcome,
    Record,
    StartupHookFailed,
    WorkerStopped,
)
from conveyor.testing.worker import TestWorker

__all__ = [
    "Attempt",
    "BatchCall",
    "DeadLettersFound",
    "NotSettled",
    "Outcome",
    "Record",
    "StartupHookFailed",
    "TestWorker",
    "WorkerStopped",
]
