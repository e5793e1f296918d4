"""Reproducible benchmarks behind ``conveyor bench``; each prints its baseline too."""

from conveyor.platform.errors import ConveyorError


class BenchmarkError(ConveyorError, RuntimeError):
    """A benchmark could not run, or its run did not measure what it was meant to (a
    missing server, daemons that never shared the queues, a variant that failed). Also a
    :class:`RuntimeError`, as these were before Conveyor had one error tree."""
