"""Installed as users install it: ``python -m build`` makes an sdist and a wheel (the wheel
built from the sdist, so the sdist is complete), the wheel installs into a fresh virtualenv
with no source tree in reach, and the installed ``conveyor`` runs the demo and hands out
the configs the docs name.

The build and the install reach PyPI for what is not in pip's cache (setuptools for the
isolated build, the runtime dependencies for the venv).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from fnmatch import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

LEFT_OUT = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.pyc", "build", "dist",
                                  "*.egg-info", ".mypy_cache", ".pytest_cache", ".ruff_cache")


def run(*args: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def test_the_package_list_names_every_package_under_conveyor() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts)
               for p in (ROOT / "conveyor").rglob("__init__.py")}
    # Two packages of data alone: the shipped configs, and the console page's CSS and
    # JavaScript (listed, so that setuptools ships them without a warning).
    assert set(config["packages"]) == on_disk | {"conveyor.configs", "conveyor.console.static"}
    assert config["package-dir"]["conveyor.configs"] == "configs"
    static = {p.name for p in (ROOT / "conveyor" / "console" / "static").iterdir()}
    assert static and all(any(fnmatch(name, pattern) for pattern in config["package-data"][
        "conveyor.console.static"]) for name in static)


def test_the_wheel_installs_in_a_fresh_venv_and_runs_the_demo(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=LEFT_OUT)  # the worktree as it is, not touched
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--outdir", dist, source, cwd=tmp_path)
    wheels, sdists = list(dist.glob("*.whl")), list(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    shipped = {f"conveyor/configs/{p.name}" for p in (ROOT / "configs").glob("*.toml")}
    assert shipped and shipped <= names
    assert {"_conveyor_cli.py", "conveyor/py.typed", "conveyor/examples/demo.py",
            "conveyor/console/page.html", "conveyor/console/static/console.css",
            "conveyor/console/static/console.js"} <= names
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    pip, python, conveyor = (venv / "bin" / n for n in ("pip", "python", "conveyor"))
    run(pip, "install", "--disable-pip-version-check", wheels[0], cwd=tmp_path)
    home = tmp_path / "user"  # nowhere near a source tree
    home.mkdir()
    where = run(python, "-c", "import conveyor; print(conveyor.__file__)", cwd=home).stdout
    assert where.startswith(str(venv)), where

    demo = run(conveyor, "demo", "--messages", "2000", "--streams", "50", "--poison", "3",
               cwd=home, timeout=120)
    assert re.search(r"^published=2000 handled=1997 dead_lettered=3 duplicates=0 lost=0 "
                     r"elapsed_s=\d+\.\d\d$", demo.stdout, re.MULTILINE), demo.stdout

    listed = run(conveyor, "configs", cwd=home).stdout
    assert {"local", "redis", "kafka"} <= {line.split()[0] for line in listed.splitlines()
                                           if line.strip() and not line.startswith("(")}
    printed = run(conveyor, "configs", "redis", cwd=home).stdout
    assert printed == (ROOT / "configs" / "redis.toml").read_text()
    run(conveyor, "configs", "--copy", "configs", cwd=home)
    assert (home / "configs" / "kafka.toml").read_bytes() == (
        ROOT / "configs" / "kafka.toml").read_bytes()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert run(conveyor, "--version", cwd=home).stdout.strip() == f"conveyor {project['version']}"
