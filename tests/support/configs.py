"""The example config file and ways to edit it, for the check-config tests."""

from __future__ import annotations

from support.paths import REPO


EXAMPLE = REPO / "config" / "powerbudgetd.toml"


FEED_KEYS = ("[feed]", "breaker_a", "volts", "derating", "psu_efficiency", "host_w")


def uncomment(text: str, keys: tuple[str, ...]) -> str:
    """The example with the commented lines that start with ``keys`` switched on."""
    out = []
    for line in text.splitlines():
        body = line.removeprefix("# ")
        out.append(body if line.startswith("# ") and body.startswith(keys) else line)
    return "\n".join(out) + "\n"
