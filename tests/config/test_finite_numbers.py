"""A number in the config that is not finite (TOML's nan and inf) is refused as not
finite, not as "should be less than or equal to" a bound it is not above."""

from __future__ import annotations

import pytest

from powerbudgetd.config import ConfigError, load_config


@pytest.mark.parametrize("text, field", [
    ("budget_w = nan\n", "budget_w"),
    ("budget_w = inf\n", "budget_w"),
    ("budget_w = 1000\n[control]\ntick_s = nan\n", "control.tick_s"),
    ("budget_w = 1000\n[feed]\nbreaker_a = nan\nvolts = 120\nhost_w = 300\n", "feed.breaker_a"),
])
def test_a_number_that_is_not_finite_is_named_so(tmp_path, text, field):
    path = tmp_path / "pb.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    line = next(x for x in str(info.value).splitlines() if x.strip().startswith(f"{field}:"))
    assert "finite number" in line
    assert "less than" not in line
