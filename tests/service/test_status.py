"""`status` with a config file broken since the daemon loaded it still finds the daemon:
it reads that file's [metrics] alone and says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerbudgetd.cli import main


def test_a_broken_config_still_gives_its_metrics_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "pb.toml"
    cfg.write_text('budget_w = "not a number"\n[metrics]\nport = 1\n')  # nothing listens on port 1
    rc = main(["status", "--config", str(cfg), "--timeout", "0.5"])
    err = capsys.readouterr().err
    assert rc == 1, err  # unreachable, not a config error
    assert "does not load" in err and "reading its [metrics] alone" in err
    assert "127.0.0.1:1/metrics" in err
