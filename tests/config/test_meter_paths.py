"""Meter paths: list items by index or summed (core.meterpath), and a ``json_path`` under
a preset checked against the preset's sample payloads, so ``check-config`` (and ``run``)
refuse a path the device never publishes instead of ignoring it."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerbudgetd.config import METER_SAMPLES, WallMeterConfig
from powerbudgetd.core.meterpath import PathError, watts_at
from support.daemon import cli, no_traceback

TWO = METER_SAMPLES["tasmota"][1]


def test_a_channel_by_index_or_every_channel_summed() -> None:
    assert watts_at(TWO, ("ENERGY", "Power", "1")) == 400
    assert watts_at(TWO, ("ENERGY", "Power", "*")) == 812
    assert watts_at({"meters": [{"power": 1.5}, {"power": 2.5}]}, ("meters", "*", "power")) == 4.0
    assert watts_at(812.5, ()) == 812.5
    with pytest.raises(PathError, match=r"ENERGY.Power is a list of 2 channels: pick one \(ENERGY.Power.0\) or sum"):
        watts_at(TWO, ("ENERGY", "Power"))
    with pytest.raises(PathError, match="no ENERGY.Power.2"):
        watts_at(TWO, ("ENERGY", "Power", "2"))
    with pytest.raises(PathError, match="ENERGY.Power.\\*: an empty list"):
        watts_at({"ENERGY": {"Power": []}}, ("ENERGY", "Power", "*"))
    with pytest.raises(PathError, match="is not a number"):
        watts_at({"ENERGY": {"Power": [1, True]}}, ("ENERGY", "Power", "*"))


@pytest.mark.parametrize("preset, extra, path", [
    ("tasmota", 'topic = "plug"', "ENERGY.Power.1"), ("tasmota", 'topic = "plug"', "ENERGY.Power.*"),
    ("tasmota", 'topic = "plug"', "ENERGY.Power"), ("shelly", 'prefix = "shelly"', "apower"),
])
def test_a_path_the_preset_publishes_is_accepted(preset: str, extra: str, path: str) -> None:
    cfg = WallMeterConfig.model_validate({"preset": preset, **dict([extra.replace('"', "").split(" = ")]),
                                          "json_path": path})
    assert cfg.power_path() == tuple(path.split("."))


@pytest.mark.parametrize("preset, extra, path, why", [
    ("tasmota", 'topic = "plug"', "StatusSNS.ENERGY.Power", "no StatusSNS"),  # the path from `Status 8`
    ("tasmota", 'topic = "plug"', "ENERGY.Power.2", "no ENERGY.Power.2"),
    ("tasmota", 'topic = "plug"', "ENERGY.Watts", "no ENERGY.Watts"),
    ("shelly", 'prefix = "shelly"', "switch:0.apower", "no switch:0"),  # the path from the RPC status
])
def test_check_config_refuses_a_path_the_preset_never_publishes(tmp_path: Path, preset: str, extra: str,
                                                                path: str, why: str) -> None:
    config = tmp_path / "pb.toml"
    config.write_text(f'budget_w = 1000\n[feed]\nbreaker_a = 15\nhost_w = 200\n[mqtt]\nhost = "127.0.0.1"\n'
                      f'[mqtt.wall_meter]\npreset = "{preset}"\n{extra}\njson_path = "{path}"\n')
    p = cli("check-config", str(config))
    no_traceback(p)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"json_path {path!r} finds no watts in a {preset} payload" in p.stderr and why in p.stderr
