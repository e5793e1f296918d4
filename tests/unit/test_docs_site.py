"""The docs site: it builds with --strict, its configuration reference names every
setting the code has, and the README stays a short front page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import msgspec

import conveyor
from tools import mkdocs_hooks
from tools.config_reference import PAGE, render, sections

ROOT = Path(__file__).resolve().parents[2]


def config_fields(cls: type = conveyor.Config, path: str = "") -> list[str]:
    """Every leaf setting of the config, walked here independently of the generator."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    out: list[str] = []
    for f in info.fields:
        name = f"{path}.{f.name}" if path else f.name
        if isinstance(f.type, msgspec.inspect.StructType):
            out += config_fields(f.type.cls, name)
        else:
            out.append(name)
    return out


def test_the_site_builds_strict_with_a_reference_page_naming_every_setting(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    reference = (tmp_path / PAGE.replace(".md", ".html")).read_text()
    fields = config_fields()
    assert len(fields) > 90
    assert [f for f in fields if f'id="{f}"' not in reference] == []
    tour = (tmp_path / "getting-started.html").read_text()
    assert "handled order-1: 1200 cents" in tour  # the README's tour, included
    # Opened from file:// (the README: "open site/index.html"), a link to a directory
    # shows a listing: every page links to pages as files.
    links = re.findall(r'href="([^"#:]+)', (tmp_path / "index.html").read_text())
    assert "getting-started.html" in links
    assert [link for link in links if link.endswith("/") or link == "."] == []


def test_the_reference_has_every_setting_with_its_meaning_default_and_type() -> None:
    rows = {f.path: f for _, _, found in sections() for f in found}
    assert sorted(rows) == sorted(config_fields())
    assert [path for path, f in rows.items() if not f.doc] == []  # a docstring each
    assert rows["worker.cache_capacity"].default == "`1024`"
    assert rows["worker.cache_capacity"].type == "integer (≥ 1)"
    assert rows["queues.total"].type == "integer (≥ 1, ≤ 4,096)"
    assert rows["kafka.idempotence"].type == '`"auto"` \\| `"off"` \\| `"on"`'
    assert rows["http.port"].default == "unset"
    page = render()
    assert "## `[slots.resource]`" in page and "## `[balancer.weights]`" in page


def test_a_nav_entry_whose_page_is_not_written_yet_is_left_out_and_not_linked(
    tmp_path: Path,
) -> None:
    (tmp_path / "here.md").write_text("# here\n")
    nav = [{"Home": "here.md"}, {"Later": "later.md"},
           {"Group": [{"Gone": "gone.md"}]}, {"Reference": PAGE}]
    config = mkdocs_hooks.on_config({"nav": nav, "docs_dir": str(tmp_path)})
    assert config["nav"] == [{"Home": "here.md"}, {"Reference": PAGE}]
    markdown = mkdocs_hooks.on_page_markdown(
        "See [later](later.md) and [here](here.md).", None, config, None)
    assert markdown == "See later and [here](here.md)."


def test_a_readme_section_is_included_with_its_links_made_relative_to_the_site(
    tmp_path: Path,
) -> None:
    (tmp_path / "concepts.md").write_text("# c\n")
    readme = ("# T\n\n## A tour\n\nSee [concepts](docs/concepts.md#x), [missing](docs/no.md),\n"
              "[the changelog](CHANGELOG.md) and [a site](https://example.org).\n\n## Next\n\nno\n")
    body = mkdocs_hooks.readme_section("A tour", readme, docs_dir=tmp_path)
    assert body == ("\nSee [concepts](concepts.md#x), missing,\n"
                    "the changelog and [a site](https://example.org).\n\n")


def test_a_marker_above_a_code_block_gets_a_blank_line_so_the_fence_stays_a_fence() -> None:
    markdown = mkdocs_hooks.on_page_markdown(
        "<!-- docs: redis -->\n```python\nx = 1\n```\n", None, {"docs_dir": "docs"}, None)
    assert markdown == "<!-- docs: redis -->\n\n```python\nx = 1\n```\n"


def test_the_readme_is_a_short_front_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 350


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but ``-`` and ``_``
    dropped, each space a ``-`` (``--x`` stays ``--x``, where the site's slug squeezes it)."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
    return text.replace(" ", "-")


def site_slug(heading: str) -> str:
    """The anchor the site's toc extension gives it (Python-Markdown's default slugify)."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "").strip().lower())
    return re.sub(r"[-\s]+", "-", text)


def test_the_readmes_links_into_docs_land_on_their_heading_on_github_and_on_the_site() -> None:
    # The README is read on GitHub, and its tour on the site: an anchor must be both
    # slugs at once (a heading with `--processes` in it was one of them only).
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[\w-]+\.md)#([^)\s]+)\)", readme)
    assert len(links) >= 8
    wrong = []
    for page, anchor in links:
        headings = re.findall(r"^#{1,6} (.+)$", (ROOT / page).read_text(), re.MULTILINE)
        if not any(github_slug(h) == site_slug(h) == anchor for h in headings):
            wrong.append(f"{page}#{anchor}")
    assert wrong == []


def test_the_slugs_differ_where_github_keeps_a_double_hyphen() -> None:
    heading = "More processes on lag: `conveyor worker --processes MIN:MAX`"
    assert github_slug(heading) == "more-processes-on-lag-conveyor-worker---processes-minmax"
    assert site_slug(heading) == "more-processes-on-lag-conveyor-worker-processes-minmax"


def test_the_install_page_names_every_optional_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    page = (ROOT / "docs" / "install.md").read_text()
    extras = project["optional-dependencies"]
    assert extras
    assert [name for name in extras if f"`conveyor[{name}]`" not in page] == []
