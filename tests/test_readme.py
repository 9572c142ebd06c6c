"""The README's generated parts cannot drift from the code."""

from __future__ import annotations

import ast
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


ROOT = Path(__file__).parent.parent
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()


def _layers_block() -> str:
    section = ARCHITECTURE.split("## Layers", 1)[1]
    return section.split("```", 2)[1]


def _modules() -> list[Path]:
    return sorted(
        p.relative_to(ROOT / "controller")
        for p in (ROOT / "controller").rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
    )


def _listed(block: str) -> set[str]:
    """The modules the Layers block lists: a package line (`  name/`) opens a
    package, its module lines are indented by four."""
    listed = set()
    package = ""
    for line in block.splitlines():
        if m := re.match(r"^  ([a-z_]+)/", line):
            package = m.group(1) + "/"
        elif m := re.match(r"^  ([a-z_]+\.py)\b", line):
            package = ""
            listed.add(m.group(1))
        elif (m := re.match(r"^    ([a-z_]+\.py)\b", line)) and package:
            listed.add(package + m.group(1))
    return listed


def test_every_module_is_in_the_layers_block_under_its_package() -> None:
    """docs/architecture.md's Layers block names every module of the
    controller, each under the package that holds it."""
    listed = _listed(_layers_block())
    assert [m.as_posix() for m in _modules() if m.as_posix() not in listed] == []


def test_every_package_docstring_names_its_modules() -> None:
    missing = []
    for module in _modules():
        if module.parent.as_posix() == ".":
            continue
        init = ROOT / "controller" / module.parent / "__init__.py"
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        if not re.search(rf"`{re.escape(module.stem)}`", docstring):
            missing.append(module.as_posix())
    assert missing == []
