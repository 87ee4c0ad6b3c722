"""`status --config` finds the running daemon when the file broke since it loaded it
(a reload refused) even where the mistake is in [metrics] itself: a key [metrics] does
not know is left aside, and its port and address still read."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerbudgetd.cli import main


def test_an_unknown_key_in_metrics_does_not_hide_its_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "pb.toml"
    cfg.write_text('budget_w = 1000\n[metrics]\nport = 1\nbudget_w = "lots"\n')  # nothing listens on port 1
    rc = main(["status", "--config", str(cfg), "--timeout", "0.5"])
    err = capsys.readouterr().err
    assert rc == 1, err  # unreachable, not a config error
    assert "does not load" in err and "reading its [metrics] alone" in err
    assert "127.0.0.1:1/metrics" in err


def test_a_bad_port_is_still_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "pb.toml"
    cfg.write_text('budget_w = 1000\n[metrics]\nport = "x"\n')
    assert main(["status", "--config", str(cfg), "--timeout", "0.5"]) == 2
    assert "metrics.port" in capsys.readouterr().err
