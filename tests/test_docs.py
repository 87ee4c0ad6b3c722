"""The manual: a short README, a site that builds strictly, and reference pages that are
the code's (every metric, config key, command and exit status, none stale)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from support.paths import REPO

README_MAX_LINES = 200


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "docs" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _reference(name: str) -> str:
    return (REPO / "docs" / "reference" / name).read_text()


def test_the_readme_is_short() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the manual's place is docs/"


def test_no_reference_page_is_stale() -> None:
    stale = _generator().stale()
    assert not stale, f"stale: {stale}; run python docs/gen_reference.py"


def test_the_staleness_check_sees_an_edited_page(tmp_path: Path) -> None:
    gen = _generator()
    shutil.copytree(REPO / "docs" / "reference", tmp_path, dirs_exist_ok=True)
    assert gen.stale(tmp_path) == []
    page = tmp_path / "metrics.md"
    page.write_text(page.read_text().replace("powerbudgetd_budget_watts", "powerbudgetd_budget_watt"))
    assert gen.stale(tmp_path) == ["metrics.md"]
    (tmp_path / "commands.md").unlink()
    assert gen.stale(tmp_path) == ["metrics.md", "commands.md"]


def test_every_declared_metric_and_alert_is_in_the_reference() -> None:
    import yaml

    from powerbudgetd.channels.metricnames import DECLARED

    page = _reference("metrics.md")
    missing = [s for spec in DECLARED for s in spec.series if f"`{s}`" not in page]
    assert not missing
    rules = yaml.safe_load((REPO / "config" / "prometheus-rules.yml").read_text())
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert alerts and all(f"`{a}`" in page for a in alerts)


def test_every_config_key_is_in_the_reference() -> None:
    from pydantic import BaseModel

    from powerbudgetd.config import Settings

    page = _reference("configuration.md")
    seen: set[type] = set()

    def keys(model: type[BaseModel]) -> list[str]:
        if model in seen:
            return []
        seen.add(model)
        out = []
        for name, info in model.model_fields.items():
            out.append(name)
            for arg in (info.annotation, *getattr(info.annotation, "__args__", ())):
                for a in (arg, *getattr(arg, "__args__", ())):
                    if isinstance(a, type) and issubclass(a, BaseModel):
                        out += keys(a)
        return out

    names = keys(Settings)
    assert len(names) > 50
    missing = [n for n in names if f"`{n}`" not in page and f".{n}]`" not in page and f"[{n}]`" not in page and f"[{n}.<key>]`" not in page]
    assert not missing


def test_every_command_and_option_is_in_the_reference() -> None:
    import argparse

    from powerbudgetd.cli import _parser

    page = _reference("commands.md")

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    assert f"## `{prefix} {name}`" in page, f"{prefix} {name}"
                    walk(sub, f"{prefix} {name}")
            elif prefix != "powerbudgetd" and not isinstance(action, argparse._HelpAction):
                for opt in action.option_strings:
                    assert f"`{opt}" in page, f"{prefix} {opt}"

    walk(_parser(), "powerbudgetd")


def test_every_exit_status_is_in_the_reference() -> None:
    from powerbudgetd.errors import ExitStatus

    page = _reference("exit-status.md")
    for status in ExitStatus:
        row = next((line for line in page.splitlines() if line.startswith(f"| {int(status)} | `{status.name}` |")), "")
        assert row and not row.endswith("|  |"), f"exit {int(status)} has no meaning in the reference"


def _mkdocs(site: Path, docs_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` (not ``-q``: a quiet build does not count its warnings)."""
    config = REPO / "mkdocs.yml"
    if docs_dir is not None:  # the same config over another copy of the pages
        text = config.read_text() + f"\ndocs_dir: {docs_dir}\n"
        config = site.parent / "mkdocs.yml"
        config.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.slow  # a whole site build
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    p = _mkdocs(tmp_path / "site")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "site" / "reference" / "metrics" / "index.html").is_file()


@pytest.mark.slow  # a whole site build
def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    page = docs / "guides" / "sizing.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    p = _mkdocs(tmp_path / "site", docs)
    assert p.returncode != 0
    assert "no-such-page.md" in p.stderr
