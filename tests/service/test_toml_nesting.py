"""Every TOML file the project reads (the config, a power tree, a scenario) is refused
with one line at any nesting depth: never a RecursionError's traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerbudgetd.cli import main
from powerbudgetd.errors import ExitStatus

NESTINGS = {
    "arrays": lambda n: "x = " + "[" * n + "]" * n + "\n",
    "inline tables": lambda n: "x = " + "{ a = " * n + "1" + " }" * n + "\n",
    "dotted keys": lambda n: "x" + ".a" * n + " = 1\n",
}
TREE = '[nodes.r]\nbudget_w = 1000\n[hosts.h]\ncords = { r = 1.0 }\nreserve_w = 100\n'


@pytest.fixture(params=[(kind, depth) for kind in NESTINGS for depth in (20, 2000, 20000)],
                ids=lambda p: f"{p[0]}-{p[1]}")
def deep(request, tmp_path: Path) -> Path:
    kind, depth = request.param
    path = tmp_path / "deep.toml"
    path.write_text(NESTINGS[kind](depth))
    return path


def one_line_naming(err: str, path: Path) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-2000:]
    assert str(path) in lines[0] and "nested" in lines[0] and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["check-config", "{deep}"],
    ["check-config", "--tree", "{deep}", "{good_config}"],
    ["circuit", "init", "--tree", "{deep}", "--endpoint", "127.0.0.1:9", "--name", "c"],
    ["simulate", "--scenario", "{deep}", "--duration", "5"],
])
def test_a_file_nested_at_any_depth_is_refused_on_one_line(argv, deep, tmp_path, capsys):
    good = tmp_path / "pb.toml"
    good.write_text("budget_w = 1000\n")
    rc = main([a.format(deep=deep, good_config=good) for a in argv])
    assert rc == ExitStatus.CONFIG
    one_line_naming(capsys.readouterr().err, deep)


def test_a_tree_nested_too_deep_inside_a_valid_file_is_refused_on_one_line(tmp_path, capsys):
    path = tmp_path / "tree.toml"
    path.write_text(TREE + "[sim]\nscenarios = " + "[" * 3000 + "]" * 3000 + "\n")
    assert main(["simulate", "--circuit", "--tree", str(path)]) == ExitStatus.CONFIG
    one_line_naming(capsys.readouterr().err, path)
