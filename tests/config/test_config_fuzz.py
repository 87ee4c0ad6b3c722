"""Config fuzzing: whatever the file holds, the answer is a Settings or a ConfigError
that names the file (and the field, where there is one) — never a traceback."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerbudgetd.config import Settings, load_config
from powerbudgetd.errors import ConfigError
from support.examples import examples

KEYS = {
    "": ["budget_w", "log_level", "allow_monitor_only", "nvml_init_attempts", "enable_persistence_mode", "bogus"],
    "feed": ["breaker_a", "volts", "derating", "ups_w", "ups_margin", "psu_efficiency", "host_w", "amps"],
    "control": ["tick_s", "donor_hold_s", "wake_fraction", "donor_enter_fraction", "settle_s", "confirm_timeout_s"],
    "cards.0": ["exclude", "max_w", "priority", "min_w"],
    "metrics": ["enabled", "listen_address", "port"],
    "recorder": ["enabled", "interval_s", "max_file_bytes", "max_total_bytes"],
    "sim": ["scenario", "seed", "lag_s"],
}


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    return json.dumps(v)  # a TOML basic string


values = st.one_of(
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from([0, -1, 1e9, 0.5, 1000, "1000", "info", "127.0.0.1"]),
)


@st.composite
def documents(draw):
    sections = {}
    for section in draw(st.lists(st.sampled_from(list(KEYS)), max_size=4, unique=True)):
        keys = draw(st.lists(st.sampled_from(KEYS[section]), min_size=1, max_size=4, unique=True))
        sections[section] = {k: draw(values) for k in keys}
    lines = [f"{k} = {toml_value(v)}" for k, v in sections.pop("", {}).items()]
    for section, body in sections.items():
        lines.append("[" + section.replace("cards.0", 'cards."0"') + "]")
        lines += [f"{k} = {toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(documents(), st.text(max_size=200)))
def test_any_file_gives_settings_or_a_config_error_naming_it(tmp_path, text):
    path = tmp_path / "fuzz.toml"
    path.write_text(text)
    path.chmod(0o600)
    try:
        result = load_config(path)
    except ConfigError as exc:
        assert str(path) in str(exc)
    else:
        assert isinstance(result, Settings) and result.effective_budget_w() > 0


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("budget_w = -5\n", "budget_w"),
        ("budget_w = 1e9\n", "budget_w"),
        ('budget_w = "lots"\n', "budget_w"),
        ("budget_w = 1000\nbudgett_w = 900\n", "budgett_w"),
        ("budget_w = 1000\n[control]\ntick_s = 0\n", "control.tick_s"),
        ("budget_w = 1000\n[feed]\nbreaker_a = 15\n", "feed"),
        ("budget_w = 1000\n[cards.0]\nmax_w = -1\n", "cards.0.max_w"),
        ("budget_w = [1000\n", "not valid TOML"),
    ],
)
def test_bad_values_name_the_field_and_the_file(tmp_path, text, names):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert names in str(info.value) and str(path) in str(info.value)
