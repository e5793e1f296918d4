"""``conveyor deploy kubernetes``: print (or write) the manifests of one app's workers.

Registered on the main command in :mod:`conveyor.cli`; the rendering itself is
:mod:`conveyor.deploy.kubernetes`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from conveyor.cli.common import FilePath, warn
from conveyor.cli.common import usage as _usage
from conveyor.platform.errors import ConfigError, ConveyorError, InvalidArgumentError

_QUANTITY = re.compile(r"(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][-+]?\d+)?")
"""A Kubernetes resource quantity, as a request takes it: ``500m``, ``2``, ``512Mi``."""

_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A namespace's name: a DNS-1123 label."""

_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?P<name>(?:(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?/)?"
    rf"{_PATH_PART}(?:/{_PATH_PART})*)"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@(?:sha256:[0-9a-f]{64}|sha384:[0-9a-f]{96}|sha512:[0-9a-f]{128}))?"
)
"""An image reference, as the container runtime parses it (the distribution/reference
grammar, with go-digest's registered digests): an optional registry ``host[:port]/``,
lower-case repository path components, an optional ``:tag`` and/or ``@sha256:HEX`` (64
lower-case hex digits; sha384, sha512 too). The name is at most 255 characters."""


def _quantity(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """--cpu, --memory: refused here, not by the API server at ``kubectl apply``."""
    if not _QUANTITY.fullmatch(value):
        raise click.BadParameter(
            f"{value!r} is not a Kubernetes quantity (e.g. 500m, 2, 512Mi, 1Gi)")
    return value


def _output(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """--output: a directory (made if missing, its manifests written over) or ``-``.

    A file where the directory (or one of its parents) would go was reported as the
    ``mkdir``'s "File exists", after the rendering; it is refused first, saying what the
    option takes (a single file is ``-o -`` redirected)."""
    if not value:  # Path('') is the current directory: manifests written there
        raise click.BadParameter("an empty path names no directory ('-': standard output)")
    if value != "-":
        path = Path(value)
        try:
            found = next((p for p in (path, *path.parents) if p.exists()), None)
        except OSError as exc:  # a name past the file system's limit: ENAMETOOLONG
            raise click.BadParameter(f"{value}: {exc.strerror}") from None
        if found is not None and not found.is_dir():
            raise click.BadParameter(
                f"{str(found)!r} is a file, not a directory: --output takes a directory "
                "(made if missing) for one file per object, or '-' for one YAML stream on "
                "stdout (one file of them all: '-o - > FILE')")
    return value


def _namespace(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not _NAMESPACE.fullmatch(value):
        raise click.BadParameter(
            f"{value!r} is not a namespace name (lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63)")
    return value


def _image(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--image: refused here, not by the kubelet as the pods fail to pull it."""
    if value is None:
        return None
    found = _IMAGE.fullmatch(value)
    if found is None or len(found["name"]) > 255:
        shown = repr(value if len(value) <= 80 else value[:80] + "...")
        raise click.BadParameter(
            f"{shown} is not an image reference ([HOST[:PORT]/]PATH[:TAG][@DIGEST], the "
            "path in lower case, e.g. shop:1.4, registry.example.com:5000/team/shop:1.4, "
            "shop@sha256:<64 hex digits>)")
    return value


@click.group()
def deploy() -> None:
    """Render Kubernetes manifests for an app's workers.

    \b
    Examples:
      conveyor deploy kubernetes --app shop:app --config configs/redis.toml
    """


@deploy.command(short_help="Manifests: ConfigMap, Deployment and KEDA ScaledObject.")
@click.option("--app", "app_path", required=True, metavar="APP_PATH",
              help="MODULE:ATTR or FILE.py:ATTR, as the container sees it (under /app); "
                   "imported here to read the app's name.")
@click.option("--config", "config_path", required=True,
              type=FilePath(exists=True, dir_okay=False, path_type=Path),
              help="The TOML config the pods run (redis or kafka); put in a ConfigMap.")
@click.option("--image", default=None, callback=_image,
              help="Worker image holding the app under /app, as [HOST[:PORT]/]PATH[:TAG]"
                   "[@DIGEST] (PATH in lower case). Default: conveyor:VERSION.")
@click.option("--replicas", type=click.IntRange(min=0), default=1, show_default=True,
              help="KEDA's minimum replicas (0: scale to zero when there is no lag).")
@click.option("--max-replicas", type=click.IntRange(min=1), default=None,
              help="KEDA's maximum. Default: [queues] total (one pod per queue at most).")
@click.option("--namespace", default=None, callback=_namespace,
              help="Namespace of every object (default: none set, kubectl's current one).")
@click.option("--http-port", type=click.IntRange(1, 65535), default=9464, show_default=True,
              help="Port of /metrics, /healthz and /readyz in the pod.")
@click.option("--cpu", default="500m", show_default=True, callback=_quantity,
              help="CPU request per pod.")
@click.option("--memory", default="512Mi", show_default=True, callback=_quantity,
              help="Memory request and limit per pod.")
@click.option("--output", "-o", default="-", show_default=True, metavar="DIR|-", callback=_output,
              help="'-': one YAML stream on stdout; DIR: one file per object, in apply "
                   "order (kubectl apply -f DIR), made if missing. The files an earlier "
                   "render wrote there are replaced, or removed if no longer rendered; "
                   "any other file in the way is refused.")
def kubernetes(app_path: str, config_path: Path, image: str | None, replicas: int,
               max_replicas: int | None, namespace: str | None, http_port: int, cpu: str,
               memory: str, output: str) -> None:
    """Kubernetes manifests: ConfigMap, Deployment and KEDA ScaledObject.

    A ConfigMap with the config, a Deployment with probes and a grace period above the
    drain, and a KEDA ScaledObject on the broker's own lag (Kafka consumer-group lag,
    Redis stream-group lag).

    Names (streams, topic, consumer group) come from the config and the app, so they
    match what the workers use. Exit status 2 for a config that cannot span pods (the
    memory adapter, a static balancer, in-process membership) or a bad argument.

    \b
    Examples:
      conveyor deploy kubernetes --app shop:app --config configs/redis.toml
      conveyor deploy kubernetes --app shop:app --config configs/kafka.toml \\
          --image registry.example.com/shop:1.4 --replicas 0 -o k8s/
    """
    from conveyor.deploy import kubernetes as k8s
    from conveyor.loader import load_app
    from conveyor.platform.config import parse_config, read_config_file
    from conveyor.version import version

    try:  # read once: the file may be a pipe (<(...)), which a second read finds empty
        data = read_config_file(config_path)
        config = parse_config(data, str(config_path), environ={})  # the pods get the file
    except ConfigError as exc:
        _usage(f"config: {exc}")
    text = data.decode()  # UTF-8: parse_config refused anything else
    try:
        k8s.check_spans_pods(config)
        app = load_app(app_path)
    except ConfigError as exc:
        _usage(f"deploy kubernetes: {exc}")
    except ConveyorError as exc:
        raise click.BadParameter(str(exc), param_hint="--app") from None
    options = k8s.Options(
        app_path=app_path, app_name=app.name, config_text=text,
        image=image if image is not None else f"conveyor:{version()}", replicas=replicas,
        max_replicas=max_replicas,
        namespace=namespace, http_port=http_port, cpu=cpu, memory=memory,
    )
    try:
        objects = k8s.render(config, options)
    except (ConfigError, InvalidArgumentError) as exc:
        _usage(f"deploy kubernetes: {exc}")
    for warning in k8s.warnings(config):
        warn(warning)
    if output == "-":
        click.echo(to_yaml(objects), nl=False)
        return
    _write(Path(output), objects)


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """One YAML stream; multi-line text (the config file) as literal blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump_all(objects, Dumper=Dumper, sort_keys=False, default_flow_style=False,
                         allow_unicode=True)


def _write(directory: Path, objects: list[dict[str, Any]]) -> None:
    """One file per object; files an earlier render wrote and this one does not are
    removed, and a file Conveyor did not write is never written over
    (:mod:`conveyor.deploy.output_dir`)."""
    from conveyor.deploy import output_dir

    files = {f"{number:02d}-{obj['kind'].lower()}.yaml": to_yaml([obj]).encode()
             for number, obj in enumerate(objects, 1)}
    try:
        plan = output_dir.plan(directory, files)
        removed = output_dir.carry_out(plan)
    except output_dir.NotOursError as exc:
        _usage(f"--output: {exc}")
    except OSError as exc:
        _usage(f"--output: cannot write to {directory}: {exc.strerror or exc}")
    for name in files:
        click.echo(str(directory / name))
    for path in removed:
        click.echo(f"conveyor: removed {path}: an earlier render wrote it, this one does not",
                   err=True)
