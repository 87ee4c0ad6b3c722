"""The actuator: the only code that writes power limits.

It applies a plan in order. After the first failed write it applies no more increases
in that tick (a surprise means what we believe may be wrong), but it still applies the
remaining decreases, which are always safe. In dry-run mode it writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from powerbudgetd.errors import NvmlError
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd.core.plan import Write


@dataclass(frozen=True)
class Applied:
    """What became of one planned write: done, failed (``error``) or skipped."""

    write: Write
    error: NvmlError | None = None
    skipped: bool = False

    @property
    def done(self) -> bool:
        return self.error is None and not self.skipped


class Actuator:
    """Applies writes through the NVML layer; ``dry_run`` turns every write into a no-op."""

    def __init__(self, nvml: Nvml, dry_run: bool = False) -> None:
        self.nvml = nvml
        self.dry_run = dry_run

    def apply(self, writes: list[Write]) -> list[Applied]:
        out: list[Applied] = []
        failed = False
        for w in writes:
            if self.dry_run or (failed and w.is_increase):
                out.append(Applied(w, skipped=True))
                continue
            try:
                self.nvml.set_power_limit(w.uuid, w.to_mw / 1000.0)
            except NvmlError as exc:
                failed = True
                out.append(Applied(w, error=exc))
            else:
                out.append(Applied(w))
        return out
