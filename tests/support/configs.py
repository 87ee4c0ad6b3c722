"""Config files for the tests: the example file and ways to edit it, and the one writer
of a powerbudgetd.toml (:func:`config_file`)."""

from __future__ import annotations

from pathlib import Path

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


# A 15 A / 120 V feed (1440 W at the plug, 80 % continuous) for a daemon held to a meter.
METERED_FEED = "[feed]\nbreaker_a = 15\nvolts = 120\npsu_efficiency = 0.9\nhost_w = 50\ntransient_factor = 1.0\n"
QUIET = "[metrics]\nenabled = false\n[recorder]\nenabled = false\n"  # no endpoint, no flight recorder


def config_file(where: Path, *sections: str, budget_w: float | None = 1000, quiet: bool = False,
                mode: int | None = None) -> Path:
    """Write a powerbudgetd.toml: ``budget_w = {budget_w}`` (None: left out, for text that
    states it or leaves it out on purpose), then :data:`QUIET` when ``quiet``, then
    ``sections`` as given. ``where``: a directory (the file is ``pb.toml`` in it) or the
    file's own path. ``mode``: chmod it so (0o600: private, as a file holding a secret
    must be); None leaves the umask's. Returns the file's path."""
    path = where / "pb.toml" if where.is_dir() else where
    head = "" if budget_w is None else f"budget_w = {budget_w}\n"
    path.write_text(head + (QUIET if quiet else "") + "".join(sections))
    if mode is not None:
        path.chmod(mode)
    return path
