"""SIGHUP right after the unit's ExecStart has spawned the daemon, before the interpreter
has run a line of Python: the process survives, boots and runs on (today's Python
cannot hold a signal that early; the unit has it ignored across exec)."""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.daemon import clean_env, json_lines
from support.paths import REPO
from support.scenarios import idle_4
from support.wait import reap, wait_until

pytestmark = pytest.mark.slow  # daemons as subprocesses

UNIT = REPO / "systemd" / "powerbudgetd.service"
INSTALLED = "/opt/powerbudgetd/bin/powerbudgetd"


def exec_start(config: Path) -> list[str]:
    """The unit's ExecStart, this environment's powerbudgetd in place of the installed one."""
    line = next(x for x in UNIT.read_text().splitlines() if x.startswith("ExecStart="))
    words = shlex.split(line.removeprefix("ExecStart="))
    exe = shutil.which("powerbudgetd", path=str(Path(sys.executable).parent))
    assert exe and INSTALLED in words
    words[words.index(INSTALLED)] = exe
    words.insert(words.index("run") + 1, "--backend=sim")  # the simulated bank, not the driver's
    return [*words[: words.index("--config") + 1], str(config)]


# From 5 ms on: env itself needs about a millisecond to start and ignore SIGHUP (measured:
# most sent within 0.5 ms of the spawn end it, 1 in 40 at 2 ms on a loaded machine).
@pytest.mark.parametrize("after_s", [0.005, 0.01, 0.03])
def test_a_sighup_right_after_spawn_is_survived(tmp_path: Path, after_s: float) -> None:
    config = tmp_path / "powerbudgetd.toml"
    config.write_text(f'budget_w = 1000\n[sim]\nscenario = "{idle_4(tmp_path)}"\n'
                      "[metrics]\nenabled = false\n[recorder]\nenabled = false\n")
    log = tmp_path / "out.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(exec_start(config), stdout=out, stderr=subprocess.STDOUT, env=clean_env())
    try:
        time.sleep(after_s)
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: any(e.get("event") == "ready" for e in json_lines(log.read_text())), 30, "ready",
                   proc=proc, log=log)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, log.read_text()[-2000:]
    finally:
        reap(proc)
