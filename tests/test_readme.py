"""The README's generated parts cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

from controller.config import describe, load_settings, render_table
from controller.metrics import Metrics

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_configuration_table_is_what_config_markdown_prints() -> None:
    block = README.split("<!-- config:begin -->\n", 1)[1].split("\n<!-- config:end -->", 1)[0]
    assert block == render_table(describe(load_settings({}), {}), markdown=True).strip()


def test_metrics_table_lists_exactly_the_registered_metrics() -> None:
    section = README.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", section, re.M))
    registered = set()
    for metric in Metrics().registry.collect():
        name = metric.name + ("_total" if metric.type == "counter" else "")
        registered.add(name)
    assert documented == registered
