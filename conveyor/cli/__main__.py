"""``python -m conveyor.cli``: the ``conveyor`` command, for where the script is not on the
PATH (tests, ``--reload``'s child worker)."""

from conveyor.cli import main

if __name__ == "__main__":  # pragma: no cover - imported, it runs nothing
    main(prog_name="conveyor")
