"""MkDocs hooks of the docs site (mkdocs.yml, ``hooks:``).

- The configuration reference is generated on every build from the config schema
  (``tools/config_reference.py``), so it cannot drift from the code.
- ``<!-- README: Heading -->`` on a line of its own is replaced by that ``## Heading``
  section of README.md, its links into ``docs/`` made relative to the site (a link to a
  repository file, or to a page not written yet, keeps its text only): the README's tour
  is written, and tested, once.
- A nav entry whose page does not exist yet is left out (pages other work adds), and a
  link to such a page keeps its text only, so the site builds before and after they land.
- A marker comment right above a code block (``<!-- tour: shop.py -->``, ``<!-- docs:
  redis -->``: what the tests read) gets a blank line after it: Python-Markdown would
  otherwise read the comment and the fence as one HTML block.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # mkdocs loads hooks by path; the generator is tools/
    sys.path.insert(0, str(ROOT))

from tools.config_reference import PAGE, render  # noqa: E402

_MARKER_ABOVE_FENCE = re.compile(r"^(<!--[^\n]*-->)\n(?=```)", re.MULTILINE)
_pending: set[str] = set()  # nav pages not written yet
_INCLUDE = re.compile(r"^<!-- README: (?P<heading>.+?) -->$", re.MULTILINE)
_LINK = re.compile(
    r"(?P<bang>!?)\[(?P<text>[^\]]+)\]\((?P<target>[^)#\s]*)(?P<anchor>#[^)\s]*)?\)")


def _site_link(link: re.Match[str], docs_dir: Path) -> str:
    target = link["target"]
    if target == "" or "://" in target:
        return link[0]
    page = target.removeprefix("docs/")
    if target.startswith("docs/") and page not in _pending and (
            page == PAGE or (docs_dir / page).exists()):
        return f"{link['bang']}[{link['text']}]({page}{link['anchor'] or ''})"
    return "" if link["bang"] else link["text"]  # an image that is not there: left out


def readme_section(heading: str, readme: str | None = None,
                   docs_dir: Path = ROOT / "docs") -> str:
    """The body of README.md's ``## heading`` section, its links made site-relative."""
    text = readme if readme is not None else (ROOT / "README.md").read_text()
    match = re.search(rf"^## {re.escape(heading)}\n(?P<body>.*?)(?=^## |\Z)", text,
                      re.MULTILINE | re.DOTALL)
    if match is None:
        raise ValueError(f"README.md has no section '## {heading}'")
    return _LINK.sub(lambda link: _site_link(link, docs_dir), match["body"])


def _existing(entries: list[Any], docs_dir: Path) -> list[Any]:
    """The nav without the pages that do not exist yet (remembered in ``_pending``)."""
    kept: list[Any] = []
    for entry in entries:
        [(title, target)] = entry.items() if isinstance(entry, dict) else [(None, entry)]
        if isinstance(target, list):
            target = _existing(target, docs_dir)
            if target:
                kept.append({title: target})
        elif target == PAGE or (docs_dir / target).exists():
            kept.append(entry)
        else:
            _pending.add(target)
    return kept


def on_config(config: Any) -> Any:
    _pending.clear()
    config["nav"] = _existing(config["nav"], Path(config["docs_dir"]))
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files


def _unlink_pending(markdown: str) -> str:
    def text_only(link: re.Match[str]) -> str:
        return link["text"] if link["target"] in _pending else link[0]
    return _LINK.sub(text_only, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(config["docs_dir"])
    markdown = _INCLUDE.sub(lambda m: readme_section(m["heading"], docs_dir=docs_dir), markdown)
    return _MARKER_ABOVE_FENCE.sub(r"\1\n\n", _unlink_pending(markdown))
