"""A driver that costs nothing, built from ``nullnvml.c`` (beside this file).

:func:`build` compiles it with the system's C compiler (``cc``) as ``libnvidia-ml.so.1``
in a folder; a process started with :func:`environ` loads it through the real bindings'
own loader (``CDLL("libnvidia-ml.so.1")``, found on ``LD_LIBRARY_PATH``), exactly as it
would the driver's library: ``--backend nvml``, the production path, with no GPU. Used
to time the daemon's own CPU with nothing else in the process, and to run the NVML layer
over a C library rather than the simulator's Python stand-ins.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("nullnvml.c")
LIBRARY = "libnvidia-ml.so.1"
MAX_CARDS = 1024  # nullnvml.c's MAX_CARDS
DRIVER_VERSION = "0.0.null"  # what its nvmlSystemGetDriverVersion answers


def build(directory: Path) -> Path:
    """Compile the library into ``directory`` (created if missing); returns its path.
    Raises FileNotFoundError without ``cc``, CalledProcessError on a compile error."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / LIBRARY
    subprocess.run(["cc", "-O2", "-Wall", "-shared", "-fPIC", "-pthread", "-o", str(out), str(SOURCE)], check=True)
    return out


def environ(directory: Path, cards: int = 8) -> dict[str, str]:
    """The variables that make a process load the library built in ``directory``, with
    ``cards`` cards. Raises ValueError unless 1 <= ``cards`` <= 1024."""
    if not 1 <= cards <= MAX_CARDS:
        raise ValueError(f"cards must be 1 to {MAX_CARDS}, got {cards}")
    path = os.environ.get("LD_LIBRARY_PATH")
    return {"LD_LIBRARY_PATH": f"{directory}:{path}" if path else str(directory), "NULLNVML_CARDS": str(cards)}
