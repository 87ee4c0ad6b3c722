"""The [recorder] section of the config."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerbudgetd.config import RecorderConfig, load_config
from powerbudgetd.errors import ConfigError


def test_defaults_follow_systemds_state_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    cfg = RecorderConfig()
    assert cfg.enabled and cfg.dir == Path("/var/lib/powerbudgetd")
    assert (cfg.interval_s, cfg.fsync_interval_s) == (1.0, 1.0)
    assert cfg.max_total_bytes >= 2 * cfg.max_file_bytes
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/powerbudgetd-test:/var/lib/other")
    assert RecorderConfig().dir == Path("/var/lib/powerbudgetd-test")


def test_the_section_is_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('budget_w = 900\n[recorder]\ndir = "/srv/power"\ninterval_s = 0.5\nmax_file_bytes = 65536\n'
                    "max_total_bytes = 1048576\n")
    cfg = load_config(path).recorder
    assert cfg.dir == Path("/srv/power") and cfg.interval_s == 0.5 and cfg.max_file_bytes == 65536
    path.write_text("budget_w = 900\n[recorder]\nmax_file_bytes = 65536\nmax_total_bytes = 100000\n")
    with pytest.raises(ConfigError, match="recorder.*at least twice max_file_bytes"):
        load_config(path)
    path.write_text("budget_w = 900\n[recorder]\ninterval_s = 0\n")
    with pytest.raises(ConfigError, match=r"recorder\.interval_s.*\(got 0\)"):
        load_config(path)
    path.write_text("budget_w = 900\n[recorder]\nenable = true\n")
    with pytest.raises(ConfigError, match=r"recorder\.enable"):
        load_config(path)
