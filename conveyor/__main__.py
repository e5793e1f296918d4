"""``python -m conveyor``: the ``conveyor`` command, as ``python -m conveyor.cli`` runs it
(where the script is not on the PATH)."""

from conveyor.cli import main

if __name__ == "__main__":  # pragma: no cover - imported, it runs nothing
    main(prog_name="conveyor")
