"""A key TOML keeps apart but the settings would not is refused, naming it: a setting in
another case (``budget_W``) and one key in two spellings, in any table."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerbudgetd.config import load_config
from powerbudgetd.errors import ConfigError


@pytest.mark.parametrize("text, expected", [
    ("budget_W = 900\n", ["budget_W: settings are lower case: write budget_w"]),
    ("budget_w = 1000\nBudget_w = 900\n", ["budget_w and Budget_w: the same key in two spellings; keep one",
                                          "Budget_w: settings are lower case: write budget_w"]),
    ("budget_w = 1000\n[control]\nTick_s = 0.2\n", ["control.Tick_s: settings are lower case: write tick_s"]),
    ("budget_w = 1000\n[Metrics]\nport = 1\n", ["Metrics: settings are lower case: write metrics"]),
    ('budget_w = 1000\n[cards."GPU-AB"]\nmax_w = 200\n[cards."gpu-ab"]\nmax_w = 100\n',
     ["cards.GPU-AB and cards.gpu-ab: the same key in two spellings; keep one"]),
    ('budget_w = 1000\n[feed]\nbreaker_a = 15\nvolts = 120\n[feed.transient_factors]\n"NVIDIA H200" = 1.3\n'
     '"nvidia h200" = 1.4\n',
     ["feed.transient_factors.NVIDIA H200 and feed.transient_factors.nvidia h200: the same key in two spellings; "
      "keep one"]),
], ids=["setting", "two-spellings", "nested", "section", "cards-map", "factors-map"])
def test_a_key_in_another_case_is_refused_naming_it(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = tmp_path / "pb.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path, euid=1000)
    lines = str(err.value).splitlines()
    assert lines[0] == f"{path}: invalid configuration"
    assert [line.strip() for line in lines[1:]] == expected


def test_upper_case_map_keys_alone_are_data_not_settings(tmp_path: Path) -> None:
    path = tmp_path / "pb.toml"
    path.write_text('budget_w = 1000\n[cards."GPU-AB"]\nmax_w = 200\n[feed]\nbreaker_a = 15\nvolts = 120\nhost_w = 100\n'
                    '[feed.transient_factors]\n"NVIDIA H200" = 1.3\n')
    settings = load_config(path, euid=1000)
    assert "GPU-AB" in settings.cards
