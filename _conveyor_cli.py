"""The ``conveyor`` command's entry point (``[project.scripts]``), a module of its own
outside the ``conveyor`` package so that it runs before ``import conveyor`` does.

Loading the command's modules takes a few tenths of a second. Ctrl-C meanwhile raised
``KeyboardInterrupt`` inside some import: a Python traceback and exit -2, where a Ctrl-C
at any later moment is the one line ``conveyor: interrupted`` and exit 130
(:class:`conveyor.cli.common.Interrupted`). SIGINT is held while the modules load and
released once they have: a Ctrl-C that came meanwhile then ends the command as any
other does, and no import (nor any extension module's initialisation) is cut short.
Here the main command loads; the command it runs loads its own modules under the same
hold (:class:`conveyor.cli.common.TaskGroup`).
"""

from __future__ import annotations

import signal
import sys

INTERRUPTED = 130
"""128 + SIGINT, as :data:`conveyor.cli.common.INTERRUPTED`, which is not imported yet."""


def main(prog_name: str | None = None) -> None:
    """The command; ``prog_name`` as click's (``python -m conveyor`` passes ``conveyor``,
    the script's name is its own)."""
    held = {signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        from conveyor.cli import main as command
    finally:
        try:  # a SIGINT held meanwhile is raised by this call, as it releases it
            signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        except KeyboardInterrupt:
            sys.stderr.write("conveyor: interrupted\n")
            sys.exit(INTERRUPTED)
    command(prog_name=prog_name)
