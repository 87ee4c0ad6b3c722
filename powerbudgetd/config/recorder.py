"""The flight recorder's section ([recorder])."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import (
    Field,
    model_validator,
)

from powerbudgetd.config.base import _Section

SIM_RECORDER_SUBDIR = "sim"  # run --backend sim records here, under the default recorder dir


SYSTEM_STATE_DIR = Path("/var/lib/powerbudgetd")


def _state_dir() -> Path:
    # systemd's StateDirectory=powerbudgetd sets $STATE_DIRECTORY (colon-separated).
    env = os.environ.get("STATE_DIRECTORY", "")
    return Path(env.split(":")[0]) if env else SYSTEM_STATE_DIR


def _user_state_dir() -> Path:
    """A user's own state directory for powerbudgetd: ``$XDG_STATE_HOME`` where it is
    an absolute path (the XDG rule: a relative one is ignored), else ``~/.local/state``,
    then ``powerbudgetd``."""
    env = Path(os.environ.get("XDG_STATE_HOME", ""))
    return (env if env.is_absolute() else Path.home() / ".local" / "state") / "powerbudgetd"


class RecorderConfig(_Section):
    """The flight recorder: a durable JSON-lines power log (see ``recorder.py``).

    Sizes in bytes. A record is about 140 bytes per card plus 150 (``scripts/bench-recorder``):
    at one a second the default total keeps about 17 days of a 4-card bank, 10 of 8 cards.
    """

    enabled: bool = True
    dir: Path = Field(default_factory=_state_dir)  # $STATE_DIRECTORY, else /var/lib/powerbudgetd
    interval_s: float = Field(1.0, ge=0.1, le=3600)  # one record per interval
    fsync_interval_s: float = Field(1.0, ge=0, le=3600)  # 0: fsync every record
    max_file_bytes: int = Field(16 << 20, ge=4096, le=1 << 34)
    max_total_bytes: int = Field(1 << 30, ge=8192, le=1 << 40)

    @model_validator(mode="after")
    def _check(self) -> RecorderConfig:
        if self.max_total_bytes < 2 * self.max_file_bytes:
            raise ValueError(
                f"max_total_bytes ({self.max_total_bytes}) must be at least twice max_file_bytes "
                f"({self.max_file_bytes}): the file being written counts against the total"
            )
        return self

    def dir_for(self, backend: str) -> Path:
        """Where a run on ``backend`` records: ``dir``, except that a simulated run with
        the default ``dir`` records under ``dir/sim``, apart from the real history
        (``log report`` on the default directory never sees it); by a user other than
        root, with the system's default, under the user's own state directory
        (``$XDG_STATE_HOME`` or ``~/.local/state``, then ``powerbudgetd/sim``): trying
        the simulated bank needs no root."""
        if backend == "sim" and "dir" not in self.model_fields_set:
            base = _user_state_dir() if self.dir == SYSTEM_STATE_DIR and os.geteuid() != 0 else self.dir
            return base / SIM_RECORDER_SUBDIR
        return self.dir
