"""``python -m conveyor``: the ``conveyor`` command, as the installed script runs it
(where the script is not on the PATH): SIGINT held while the command loads
(``_conveyor_cli``, installed beside the package). The package itself loads nothing
before: its names load when first asked for."""

from _conveyor_cli import main

if __name__ == "__main__":  # pragma: no cover - imported, it runs nothing
    main(prog_name="conveyor")
