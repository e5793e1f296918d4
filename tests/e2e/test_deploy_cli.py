"""`conveyor deploy kubernetes` as a user runs it: YAML out, files out, mistakes exit 2."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conveyor.deploy.output_dir import RECORD
from tests.e2e.test_cli import ROOT, conveyor


def test_it_prints_the_manifests_of_a_shipped_config_as_one_yaml_stream() -> None:
    result = conveyor("deploy", "kubernetes", "--app", "tests.apps.recorder:app",
                      "--config", "configs/kafka.toml", "--image", "shop:1",
                      "--namespace", "work")
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    assert [o["kind"] for o in objects] == ["ConfigMap", "Deployment", "ScaledObject"]
    assert objects[0]["data"]["conveyor.toml"] == (ROOT / "configs/kafka.toml").read_text()
    [trigger] = objects[2]["spec"]["triggers"]
    assert trigger["metadata"]["consumerGroup"] == "rec"  # tests/apps/recorder.py's App
    # The shipped config points at a local broker: said, not refused.
    assert result.stderr.splitlines() == [
        "conveyor: warning: $.kafka.bootstrap points at 127.0.0.1: inside a pod that is "
        "the pod itself"]


def test_a_config_given_as_a_pipe_is_the_one_in_the_configmap() -> None:
    # The config was read twice, to render and for the ConfigMap: from <(...), a pipe,
    # the second read found it empty, and the pods got `conveyor.toml: ''` (the embedded
    # memory adapter) under manifests rendered for Kafka.
    command = (f"{shlex.quote(sys.executable)} -m conveyor.cli deploy kubernetes --app "
               "tests.apps.recorder:app --config <(cat configs/kafka.toml)")
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    assert objects[0]["data"]["conveyor.toml"] == (ROOT / "configs/kafka.toml").read_text()


def test_output_dir_gets_one_file_per_object_in_apply_order(tmp_path: Path) -> None:
    out = tmp_path / "manifests"
    result = conveyor("deploy", "kubernetes", "--app", "tests.apps.recorder:app",
                      "--config", "configs/redis.toml", "--output", str(out))
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in out.iterdir() if p.name != RECORD)
    assert names == ["01-configmap.yaml", "02-deployment.yaml", "03-scaledobject.yaml"]
    assert result.stdout.split() == [str(out / n) for n in names]
    # The record of what was written, for the next render: sha256sum -c's form.
    check = subprocess.run(["sha256sum", "--check", "--strict", RECORD], cwd=out,
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.splitlines() == [f"{n}: OK" for n in names]
    [scaled] = yaml.safe_load_all((out / names[2]).read_text())
    assert len(scaled["spec"]["triggers"]) == 2 * 8  # configs/redis.toml: 8 queues


@pytest.mark.parametrize("under", ["", "sub"], ids=["the-file", "under-the-file"])
def test_an_output_that_is_a_file_is_a_usage_error_saying_what_it_takes(
        tmp_path: Path, under: str) -> None:
    """It said only "--output: cannot write to PATH: File exists" (mkdir's error, after
    the rendering), though the file was left alone: what was wrong, and what to give
    instead, unsaid."""
    file = tmp_path / "manifests.yaml"
    file.write_text("kept\n")
    result = conveyor("deploy", "kubernetes", "--app", "tests.apps.recorder:app",
                      "--config", "configs/redis.toml", "--output", str(file / under))
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    [error] = result.stderr.splitlines()  # refused before the rendering's warning
    assert error == (
        f"conveyor: error: Invalid value for '--output' / '-o': '{file}' is a file, not a "
        "directory: --output takes a directory (made if missing) for one file per object, "
        "or '-' for one YAML stream on stdout (one file of them all: '-o - > FILE') (see "
        "'conveyor deploy kubernetes --help')"), error
    assert file.read_text() == "kept\n"


def kafka_config(path: Path, *, sasl: bool) -> Path:
    """configs/kafka.toml at a broker a pod can reach (no warning), with SASL (a
    TriggerAuthentication more: four objects) or without (three)."""
    text = (ROOT / "configs/kafka.toml").read_text()
    assert '"127.0.0.1:9092"' in text
    text = text.replace('"127.0.0.1:9092"', '"kafka.shop.svc:9092"')
    if sasl:
        assert "\n[kafka]\n" in text
        text = text.replace("\n[kafka]\n", '\n[kafka]\nsecurity_protocol = "SASL_SSL"\n'
                            'sasl_username = "svc-shop"\n', 1)
    path.write_text(text)
    return path


def render_to(out: Path, cfg: Path) -> subprocess.CompletedProcess[str]:
    return conveyor("deploy", "kubernetes", "--app", "tests.apps.recorder:app",
                    "--config", str(cfg), "--output", str(out))


def yaml_files(out: Path) -> dict[str, str]:
    """What ``kubectl apply -f DIR`` reads: each .yaml file's kinds (none: "")."""
    return {p.name: ",".join(o.get("kind", "") for o in yaml.safe_load_all(p.read_text()))
            for p in sorted(out.glob("*.yaml"))}


def test_a_render_removes_the_files_of_an_earlier_one_it_no_longer_writes(
        tmp_path: Path) -> None:
    """Rendered with SASL, then without: 03-triggerauthentication.yaml and
    04-scaledobject.yaml stayed, and kubectl apply -f DIR applied the old ScaledObject
    (same name) after the new one, and a TriggerAuthentication nothing uses."""
    out = tmp_path / "k8s"
    (out / "notes").mkdir(parents=True)
    (out / "README.md").write_text("ours\n")  # the operator's: never touched
    (out / "kustomization.yaml").write_text("resources: []\n")
    first = render_to(out, kafka_config(tmp_path / "sasl.toml", sasl=True))
    assert first.returncode == 0, first.stderr
    assert yaml_files(out) == {
        "01-configmap.yaml": "ConfigMap", "02-deployment.yaml": "Deployment",
        "03-triggerauthentication.yaml": "TriggerAuthentication",
        "04-scaledobject.yaml": "ScaledObject", "kustomization.yaml": ""}

    second = render_to(out, kafka_config(tmp_path / "plain.toml", sasl=False))
    assert second.returncode == 0, second.stderr
    assert yaml_files(out) == {
        "01-configmap.yaml": "ConfigMap", "02-deployment.yaml": "Deployment",
        "03-scaledobject.yaml": "ScaledObject", "kustomization.yaml": ""}
    assert second.stderr.splitlines() == [
        f"conveyor: removed {out / name}: an earlier render wrote it, this one does not"
        for name in ("03-triggerauthentication.yaml", "04-scaledobject.yaml")]
    [scaled] = yaml.safe_load_all((out / "03-scaledobject.yaml").read_text())
    assert "authenticationRef" not in scaled["spec"]["triggers"][0]
    assert (out / "README.md").read_text() == "ours\n" and (out / "notes").is_dir()
    assert (out / "kustomization.yaml").read_text() == "resources: []\n"

    # The same render again: nothing to remove, nothing refused.
    third = render_to(out, tmp_path / "plain.toml")
    assert third.returncode == 0, third.stderr
    assert third.stderr == ""
    assert sorted(yaml_files(out)) == ["01-configmap.yaml", "02-deployment.yaml",
                                       "03-scaledobject.yaml", "kustomization.yaml"]


def assert_refused_leaving_all_as_it_was(result: subprocess.CompletedProcess[str],
                                         out: Path, before: dict[str, bytes],
                                         message: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    [error] = result.stderr.splitlines()
    assert error == f"conveyor: error: --output: {message}", error
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_file_this_command_did_not_write_is_never_written_over(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    out.mkdir()
    (out / "02-deployment.yaml").write_text("# the operator's own\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = render_to(out, kafka_config(tmp_path / "plain.toml", sasl=False))
    assert_refused_leaving_all_as_it_was(
        result, out, before,
        f"{out / '02-deployment.yaml'} is in the way: this command did not write it; move "
        "it away or remove it, or give another directory (nothing was written)")


def test_a_written_file_edited_since_is_neither_written_over_nor_removed(
        tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    sasl, plain = (kafka_config(tmp_path / "sasl.toml", sasl=True),
                   kafka_config(tmp_path / "plain.toml", sasl=False))
    assert render_to(out, sasl).returncode == 0
    edited = out / "02-deployment.yaml"
    edited.write_text(edited.read_text() + "# a hand edit\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert_refused_leaving_all_as_it_was(
        render_to(out, sasl), out, before,
        f"{edited} is in the way: it was changed since this command wrote it; move it "
        "away or remove it, or give another directory (nothing was written)")

    # Stale and edited: removing it loses the edit, keeping it has kubectl apply it.
    edited.write_bytes(before["02-deployment.yaml"].removesuffix(b"# a hand edit\n"))
    stale = out / "04-scaledobject.yaml"
    stale.write_text(stale.read_text().replace("cooldownPeriod: 300", "cooldownPeriod: 60"))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert_refused_leaving_all_as_it_was(
        render_to(out, plain), out, before,
        f"{stale}, written by an earlier render and not by this one, was changed since, "
        "and kubectl apply -f would still apply it: move it away or remove it (nothing "
        "was written)")


def test_files_holding_what_a_render_writes_are_taken_as_its_own(tmp_path: Path) -> None:
    """A directory an older Conveyor wrote (no record) rendered again unchanged: its files
    hold what this render writes, so nothing is in the way; the record starts here."""
    out = tmp_path / "k8s"
    plain = kafka_config(tmp_path / "plain.toml", sasl=False)
    assert render_to(out, plain).returncode == 0
    (out / RECORD).unlink()
    again = render_to(out, plain)
    assert again.returncode == 0, again.stderr
    assert (out / RECORD).exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "configs/local.toml"],
         'deploy kubernetes: $.queues.adapter: the embedded "memory" adapter lives inside '
         "one process and cannot span pods"),
        (["--config", "configs/redis.toml", "--max-replicas", "9"],
         "--max-replicas 9 exceeds [queues] total = 8"),
        (["--config", "configs/redis.toml", "--replicas", "-1"], "--replicas"),
        # Refused here, not later by the API server at `kubectl apply`.
        (["--config", "configs/redis.toml", "--cpu", "lots"],
         "Invalid value for '--cpu': 'lots' is not a Kubernetes quantity"),
        (["--config", "configs/redis.toml", "--memory", "512MB"],
         "Invalid value for '--memory': '512MB' is not a Kubernetes quantity"),
        (["--config", "configs/redis.toml", "--namespace", "Team_A"],
         "Invalid value for '--namespace': 'Team_A' is not a namespace name"),
        (["--config", "configs/redis.toml", "--image", "shop worker:1"],
         "Invalid value for '--image': 'shop worker:1' is not an image reference"),
        (["--config", "configs/redis.toml", "--image", ""],
         "Invalid value for '--image': '' is not an image reference"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = conveyor("deploy", "kubernetes", "--app", "tests.apps.recorder:app", *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_a_static_balancer_is_refused_naming_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "static.toml"
    cfg.write_text('[queues]\nadapter = "redis"\n[balancer]\nkind = "static"\n')
    result = conveyor("deploy", "kubernetes", "--app", "tests.apps.recorder:app",
                      "--config", str(cfg))
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: deploy kubernetes: $.balancer.kind: ")


def test_an_app_that_cannot_be_imported_is_a_usage_error() -> None:
    result = conveyor("deploy", "kubernetes", "--app", "no_such_module:app",
                      "--config", "configs/redis.toml")
    assert result.returncode == 2
    assert "--app" in result.stderr and "cannot import" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_docs_deploy_command_runs_as_printed(tmp_path: Path) -> None:
    """docs/kubernetes.md's command, with the README's own shop.py (its first snippet)
    beside the shipped configs."""
    readme = (ROOT / "README.md").read_text()
    shop = readme.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "shop.py").write_text(shop)
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    guide = (ROOT / "docs" / "kubernetes.md").read_text()
    block = next(b for b in guide.split("```console\n")[1:]
                 if "conveyor deploy kubernetes" in b.split("```", 1)[0])
    command = block.split("```", 1)[0].replace("\\\n", " ").splitlines()[0]
    assert command.startswith("$ .venv/bin/conveyor deploy kubernetes")
    argv = shlex.split(command.removeprefix("$ .venv/bin/conveyor"))
    result = subprocess.run([sys.executable, "-m", "conveyor.cli", *argv], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    written = sorted(p.name for p in (tmp_path / "k8s").iterdir())
    assert written == [RECORD, "01-configmap.yaml", "02-deployment.yaml",
                       "03-scaledobject.yaml"]
    [deployment] = yaml.safe_load_all((tmp_path / "k8s" / written[2]).read_text())
    assert deployment["metadata"] == {**deployment["metadata"], "name": "shop-worker",
                                      "namespace": "shop"}
