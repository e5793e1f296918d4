"""A directory of rendered manifests (``conveyor deploy kubernetes --output DIR``), kept
to exactly what the latest render wrote.

``kubectl apply -f DIR`` applies every ``.yaml`` file there, so a file an earlier render
wrote and this one does not (a ``TriggerAuthentication`` once SASL is off, a numbered
object that moved up) would be applied again, and a stale ``ScaledObject`` of the same
name after the current one. Each render therefore leaves a record, :data:`RECORD` (a
dotfile kubectl does not read, in ``sha256sum`` form), of the files it wrote and their
digests; the next render removes the ones it does not write again.

Conveyor replaces or removes only files it wrote and nobody changed since (their digest
is the recorded one), or files that already hold what it would write. Anything else at a
path it would write or remove — a file of the operator's, one edited by hand, one an
older Conveyor wrote without a record — is refused before anything is written
(:class:`NotOursError`): the operator decides what happens to it.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from conveyor.platform.errors import InvalidArgumentError

RECORD = ".conveyor-deploy.sha256"
"""The record of the files the latest render wrote: ``DIGEST  NAME`` a line
(``sha256sum -c`` checks it)."""

_NAME = re.compile(r"[0-9]{2}-[a-z]+\.yaml")
"""The names a render writes (``01-configmap.yaml``); a record line naming anything else
is ignored, so no record can make Conveyor remove a file of another name."""


class NotOursError(InvalidArgumentError):
    """A file Conveyor would replace or remove that is not one it wrote as it is now."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What a render does to its directory, decided before anything is written."""

    directory: Path
    files: dict[str, bytes]
    """Name to content, in apply order."""
    stale: list[str]
    """Files the previous render wrote, unchanged since, that this one does not write."""


def _digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def read_record(directory: Path) -> dict[str, str]:
    """Name to digest of what the previous render wrote; empty without a record."""
    try:
        text = (directory / RECORD).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    written = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        if re.fullmatch(r"[0-9a-f]{64}", digest) and _NAME.fullmatch(name):
            written[name] = digest
    return written


def _content(path: Path) -> bytes | None:
    """The file's content; None if nothing is there. A link or a directory (anything
    but a plain file) is none a render wrote: refused, as a changed file is."""
    if not os.path.lexists(path):
        return None
    if path.is_symlink() or not path.is_file():
        raise NotOursError(f"{path} is in the way: it is not a plain file; move it away "
                           "or remove it, or give another directory (nothing was written)")
    return path.read_bytes()


def plan(directory: Path, files: dict[str, bytes]) -> Plan:
    """What writing ``files`` (name to content) into ``directory`` does; raises
    :class:`NotOursError` naming the first file Conveyor may not replace or remove."""
    for name in files:
        if not _NAME.fullmatch(name):
            raise InvalidArgumentError(f"{name!r} is no name a render writes")
    if not directory.exists():
        return Plan(directory, files, [])
    written = read_record(directory)
    for name, content in files.items():
        path = directory / name
        found = _content(path)
        if found is None or found == content or written.get(name) == _digest(found):
            continue
        how = ("it was changed since this command wrote it" if name in written
               else "this command did not write it")
        raise NotOursError(
            f"{path} is in the way: {how}; move it away or remove it, or give another "
            "directory (nothing was written)")
    stale = []
    for name, digest in written.items():
        if name in files:
            continue
        path = directory / name
        found = _content(path)
        if found is None:
            continue
        if _digest(found) != digest:
            raise NotOursError(
                f"{path}, written by an earlier render and not by this one, was changed "
                "since, and kubectl apply -f would still apply it: move it away or remove "
                "it (nothing was written)")
        stale.append(name)
    return Plan(directory, files, stale)


def carry_out(plan: Plan) -> list[Path]:
    """Write the plan's files, remove its stale ones, then record what was written;
    returns the paths removed. The record is replaced last and whole, so a render cut
    short leaves the previous record, and the next render sees its half-written files as
    ones it may replace (they hold what it writes) or refuses them."""
    directory = plan.directory
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in plan.files.items():
        (directory / name).write_bytes(content)
    removed = []
    for name in plan.stale:
        path = directory / name
        path.unlink(missing_ok=True)
        removed.append(path)
    record = "".join(f"{_digest(content)}  {name}\n" for name, content in plan.files.items())
    partial = directory / f"{RECORD}.partial"
    partial.write_text(record, encoding="utf-8")
    partial.replace(directory / RECORD)
    return removed
