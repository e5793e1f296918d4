"""docs/apps-on-one-broker.md: every config it prints loads, and says what the text says."""

from __future__ import annotations

import re
from pathlib import Path

from conveyor.platform.config import load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "apps-on-one-broker.md"


def test_every_config_in_the_page_loads(tmp_path: Path) -> None:
    blocks = re.findall(r"<!-- runnable: config -->\n```toml\n(.*?)```", DOC.read_text(),
                        re.DOTALL)
    assert len(blocks) == 3
    configs = []
    for i, block in enumerate(blocks):
        path = tmp_path / f"{i}.toml"
        path.write_text(block)
        configs.append(load_config(path, environ={}))
    assert [c.redis.prefix for c in configs[:2]] == ["shop", "billing"]
    assert configs[2].queues.new_group_start == "latest" and configs[2].kafka.topic == "shop"
