"""check-config --tree checks its argument before any work: a tree file that is missing
or invalid, or a config without the [circuit] that places this host in it, is one
error and exit 2, with no "valid" and no budget derivation printed first."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerbudgetd.cli import main
from powerbudgetd.errors import ExitStatus

PACKAGED = Path(__file__).resolve().parents[2] / "sim" / "trees" / "row-4.toml"


@pytest.mark.parametrize("tree, config, message", [
    ("missing.toml", "budget_w = 1000\n", "missing.toml: no such tree file"),
    ("bad.toml", "budget_w = 1000\n", "bad.toml: invalid power tree"),
    (str(PACKAGED), "budget_w = 1000\n", "--tree needs [circuit]"),
])
def test_a_tree_that_cannot_be_checked_is_refused_before_the_report(tmp_path, capsys, tree, config, message):
    cfg = tmp_path / "pb.toml"
    cfg.write_text(config)
    (tmp_path / "bad.toml").write_text("[nodes.a]\nkind = \"rack\"\n")
    tree_path = tree if tree.startswith("/") else str(tmp_path / tree)
    assert main(["check-config", str(cfg), "--tree", tree_path]) == ExitStatus.CONFIG
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err
