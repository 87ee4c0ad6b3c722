"""`circuit` subcommands check --endpoint, --name and --host as the config file's
[circuit] would be: a bad one is one line naming the option and exit 2, never a
traceback, whether or not a config file gives the rest."""

from __future__ import annotations

import pytest

from powerbudgetd.cli import main
from powerbudgetd.errors import ExitStatus


@pytest.mark.parametrize("argv, words", [
    (["circuit", "leave", "--endpoint", "bogus", "--name", "row"], ["--endpoint", "not an etcd endpoint: 'bogus'"]),
    (["circuit", "status", "--endpoint", "10.0.0.5:2379", "--name", "a b"], ["--name", "'a b'"]),
    (["circuit", "leave", "--endpoint", "10.0.0.5:2379", "--name", "row", "--host", "h/1"], ["--host", "'h/1'"]),
])
def test_a_bad_option_is_one_line_and_exit_2(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("POWERBUDGETD_CONFIG", str(tmp_path / "none.toml"))
    assert main(argv) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err


def test_a_bad_endpoint_over_a_config_is_refused_too(capsys, tmp_path):
    cfg = tmp_path / "pb.toml"
    cfg.write_text('budget_w = 1000\n[circuit]\nname = "row"\nendpoints = ["10.0.0.5:2379"]\nreserve_w = 900\n')
    assert main(["circuit", "status", "--config", str(cfg), "--endpoint", "bogus"]) == ExitStatus.CONFIG
    assert "--endpoint" in capsys.readouterr().err
