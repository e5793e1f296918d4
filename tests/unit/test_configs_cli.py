"""`conveyor configs`: the shipped configs, listed, printed and copied as the docs name them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from conveyor.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_listing_names_every_shipped_config_in_80_columns() -> None:
    done = CliRunner().invoke(main, ["configs"])
    assert done.exit_code == 0, done.output
    rows = [line for line in done.output.splitlines() if line and not line.startswith("(")]
    assert {r.split()[0] for r in rows} == {p.stem for p in (ROOT / "configs").glob("*.toml")}
    assert max(len(line) for line in rows) <= 80


def test_a_name_prints_that_file_whichever_way_it_is_written() -> None:
    for name in ("kafka", "kafka.toml", "configs/kafka.toml"):
        done = CliRunner().invoke(main, ["configs", name])
        assert done.exit_code == 0 and done.output == (ROOT / "configs/kafka.toml").read_text()


def test_copy_writes_the_missing_files_and_keeps_the_existing_ones(tmp_path: Path) -> None:
    (tmp_path / "redis.toml").write_text("# mine\n")
    done = CliRunner().invoke(main, ["configs", "--copy", str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert (tmp_path / "redis.toml").read_text() == "# mine\n"
    assert (tmp_path / "local.toml").read_bytes() == (ROOT / "configs/local.toml").read_bytes()
    assert f"kept {tmp_path / 'redis.toml'} (exists)" in done.output


def test_an_unknown_name_or_name_with_copy_is_a_usage_error(tmp_path: Path) -> None:
    done = CliRunner().invoke(main, ["configs", "nope"])
    assert done.exit_code == 2 and "there are: compose, kafka, local" in done.output
    done = CliRunner().invoke(main, ["configs", "redis", "--copy", str(tmp_path)])
    assert done.exit_code == 2 and not list(tmp_path.iterdir())


def test_copy_keeps_a_symlink_in_the_way_and_writes_nothing_through_it(
    tmp_path: Path,
) -> None:
    # A link whose target does not exist yet "did not exist": the copy wrote through it,
    # outside DIR (or, its directory missing, failed naming DIR, not the file).
    outside = tmp_path / "outside"
    outside.mkdir()
    into = tmp_path / "configs"
    into.mkdir()
    (into / "redis.toml").symlink_to(outside / "redis.toml")
    done = CliRunner().invoke(main, ["configs", "--copy", str(into)])
    assert done.exit_code == 0, done.output
    assert f"kept {into / 'redis.toml'} (exists)" in done.output.splitlines()
    assert list(outside.iterdir()) == []
    assert (into / "kafka.toml").read_text() == (ROOT / "configs/kafka.toml").read_text()


def test_a_copy_cut_by_a_failed_write_leaves_no_partial_file_and_says_so_in_one_line(
    tmp_path: Path,
) -> None:
    # A write cut midway, as on a full disk: here by a file-size limit of 1,000 bytes,
    # which the first config over it reaches after writing 1,000 of its bytes (EFBIG;
    # SIGXFSZ ignored, or it would kill the command). The cut file would be "kept" as
    # it is by the next `configs --copy`. The limit is set by the command's own
    # process, before it runs the CLI: a preexec_fn runs between fork and exec, which
    # is unsafe beside the threads of a test process (it failed once, EBADF).
    limited = ("import resource, runpy, signal, sys\n"
               "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
               "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
               "sys.argv = ['conveyor', *sys.argv[1:]]\n"
               "runpy.run_module('conveyor.cli', run_name='__main__', alter_sys=True)\n")
    into = tmp_path / "configs"
    done = subprocess.run([sys.executable, "-c", limited, "configs", "--copy", str(into)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    shipped = {p.name: p.read_bytes() for p in sorted((ROOT / "configs").glob("*.toml"))}
    cut = next(name for name, text in shipped.items() if len(text) > 1000)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"conveyor: error: Invalid value for --copy: cannot write to "
                           f"{into / cut}: File too large (see 'conveyor configs --help')\n")
    written = {p.name: p.read_bytes() for p in into.iterdir()}
    assert cut not in written
    assert written and all(text == shipped[name] for name, text in written.items())
    assert done.stdout == "".join(f"wrote {into / name}\n" for name in written)
