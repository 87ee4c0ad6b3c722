"""Control parameters are declared once: the ``[control]`` section offers exactly the
fields of :class:`Timings`, with the same defaults, so the two cannot drift apart."""

from __future__ import annotations

import dataclasses

from powerbudgetd.core.model import Timings
from powerbudgetd.config import ControlConfig


def test_control_section_matches_timings_field_for_field() -> None:
    timings = {f.name: f.default for f in dataclasses.fields(Timings)}
    section = {name: info.default for name, info in ControlConfig.model_fields.items()}
    assert section.keys() == timings.keys(), (
        f"only in [control]: {sorted(section.keys() - timings.keys())}; "
        f"only in Timings: {sorted(timings.keys() - section.keys())}"
    )
    differ = {k: (section[k], timings[k]) for k in timings if section[k] != timings[k]}
    assert not differ, f"defaults differ ([control], Timings): {differ}"


def test_an_empty_control_section_gives_the_default_timings() -> None:
    assert ControlConfig().timings() == Timings()
