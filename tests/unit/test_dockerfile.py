"""The worker image's Dockerfile cannot be built here (no Docker engine): parse it
(dockerfile-parse) and check what the Kubernetes manifests rely on."""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path

from dockerfile_parse import DockerfileParser

from conveyor.deploy import kubernetes as k8s

ROOT = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    return [(i["instruction"], i["value"]) for i in parser.structure
            if i["instruction"] != "COMMENT"]


def last(name: str) -> str:
    return [value for instruction, value in instructions() if instruction == name][-1]


def admitted(path: str) -> bool:
    """Whether .dockerignore lets ``path`` into the build context (last match wins)."""
    keep = True
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            keep = negated
    return keep


def test_the_image_is_python_311_slim_with_conveyor_as_entrypoint() -> None:
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    assert parser.baseimage == "python:3.11-slim"
    assert json.loads(last("ENTRYPOINT")) == ["conveyor"]
    assert any(i == "RUN" and v.startswith("pip install .") for i, v in instructions())


def test_it_runs_as_the_non_root_user_the_deployment_names() -> None:
    user, _, group = last("USER").partition(":")
    assert user.isdigit() and int(user) != 0, "numeric, so runAsNonRoot can check it"
    assert int(user) == k8s.RUN_AS_USER and int(group) == k8s.RUN_AS_USER
    assert f"--uid {user}" in " ".join(v for i, v in instructions() if i == "RUN")


def test_the_app_directory_is_the_workdir_and_on_the_python_path() -> None:
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    assert last("WORKDIR") == k8s.APP_DIR
    assert k8s.APP_DIR in parser.envs["PYTHONPATH"].split(":")


def test_every_copied_source_exists_and_passes_the_dockerignore() -> None:
    sources = []
    for instruction, value in instructions():
        if instruction == "COPY":
            *parts, _destination = value.split()
            sources += parts
    assert {"pyproject.toml", "README.md", "conveyor"} <= set(sources)
    # The top-level modules `pip install .` installs beside the package: the command's
    # entry point is one.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    modules = pyproject["tool"]["setuptools"]["py-modules"]
    assert "_conveyor_cli" in modules
    assert {f"{module}.py" for module in modules} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source
        assert admitted(source), f"{source} is kept out of the build context"
    assert admitted("conveyor/deploy/kubernetes.py")
    for left_out in (".venv", "tests/unit/test_dockerfile.py", ".git", "docs/kubernetes.md",
                     "conveyor/__pycache__/cli.cpython-311.pyc"):
        assert not admitted(left_out), left_out
