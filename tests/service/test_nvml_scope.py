"""One NVML scope for every command (hw/nvmlscope.py): ``nvmlInit``, then
``nvmlShutdown`` within a deadline, so that a shutdown that never returns (a call
abandoned on a hung card holds the driver) does not hold a command's exit.

The simulated bank hangs ``nvmlShutdown`` on the wall clock with a SLOW fault."""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

from powerbudgetd.hw.nvmlscope import SHUTDOWN_TIMEOUT_S, NvmlScope, shutdown_within
from support.daemon import cli, no_traceback
from support.wait import free_port

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 60.0  # far past the deadline and any start-up time
HUNG_SHUTDOWN = f"""bank = "workstation-4"
[[faults]]
call = "nvmlShutdown"
error = "SLOW"
delay_s = {HANG_S}
"""


def _hung_scenario(tmp_path: Path) -> Path:
    path = tmp_path / "hung-shutdown.toml"
    path.write_text(HUNG_SHUTDOWN)
    return path


def test_probe_exits_when_nvml_shutdown_hangs(tmp_path: Path) -> None:
    began = time.monotonic()
    p = cli("probe", "--backend", "sim", "--scenario", str(_hung_scenario(tmp_path)), "--json", timeout=HANG_S / 2)
    took = time.monotonic() - began
    no_traceback(p)
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(json.loads(p.stdout)["gpus"]) == 4  # the bank was read, and shut down after
    assert took < HANG_S / 2


def test_circuit_join_exits_when_nvml_shutdown_hangs(tmp_path: Path) -> None:
    # 700 W at the wall x 0.9 - 150 W = 480 W, below the bank's 600 W of floors: refused
    # after the cards are read, before etcd is asked (nothing listens on the endpoint).
    cfg = tmp_path / "pb.toml"
    cfg.write_text(f'budget_w = 1000\n[sim]\nscenario = "{_hung_scenario(tmp_path)}"\n'
                   f'[circuit]\nname = "lab"\nendpoints = ["127.0.0.1:{free_port()}"]\nhost = "h1"\n'
                   "reserve_w = 700\npsu_efficiency = 0.9\nhost_w = 150\n")
    began = time.monotonic()
    p = cli("circuit", "join", "--backend", "sim", "--config", str(cfg), timeout=HANG_S / 2)
    took = time.monotonic() - began
    no_traceback(p)
    assert p.returncode == 3 and "refused: circuit reserve 480 W" in p.stderr, p.stdout + p.stderr
    assert took < HANG_S / 2


class _Lib:
    """An NVML whose shutdown takes ``shutdown_s`` (s); counts the calls."""

    def __init__(self, shutdown_s: float = 0.0) -> None:
        self.shutdown_s, self.inits, self.shutdowns = shutdown_s, 0, 0

    def init(self) -> None:
        self.inits += 1

    def shutdown(self) -> None:
        self.shutdowns += 1
        time.sleep(self.shutdown_s)


def test_a_scope_shuts_down_once_and_gives_up_on_a_hung_shutdown_at_its_deadline() -> None:
    lib = _Lib()
    with NvmlScope(lib) as s:
        assert lib.inits == 1 and lib.shutdowns == 0
    assert lib.shutdowns == 1 and s.close() is None and lib.shutdowns == 1  # closed once
    assert NvmlScope(lib).close() is None and lib.shutdowns == 1  # never opened: nothing to shut
    hung = _Lib(shutdown_s=5.0)
    began = time.monotonic()
    assert shutdown_within(hung, 0.2) is not None  # abandoned: the error to log
    assert time.monotonic() - began < 2.0
    assert SHUTDOWN_TIMEOUT_S <= 5.0  # inside the unit's TimeoutStopSec with the rest of a stop


def test_a_hung_init_fails_at_the_scopes_deadline() -> None:
    from powerbudgetd.errors import NvmlTimeout

    class Stuck(_Lib):
        def init(self) -> None:
            time.sleep(5.0)

    began = time.monotonic()
    try:
        NvmlScope(Stuck(), init_timeout_s=0.2).open()
    except NvmlTimeout:
        pass
    else:
        raise AssertionError("a hung nvmlInit was waited for past its deadline")
    assert time.monotonic() - began < 2.0


def nvml_shutdown_callers(paths: list[Path], root: Path = ROOT) -> list[str]:
    """Each place outside hw/nvmlscope.py that shuts NVML down itself: a reference to
    ``nvmlShutdown`` outside ``Nvml.shutdown`` (hw/nvml.py), or to ``<nvml>.shutdown`` (an
    expression naming nvml) outside hw/nvmlscope.py."""
    found = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), rel)
        wrapper: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "shutdown" and rel == "powerbudgetd/hw/nvml.py":
                wrapper |= {n.lineno for n in ast.walk(node) if hasattr(n, "lineno")}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            if node.attr == "nvmlShutdown" and node.lineno not in wrapper:
                found.append(f"{rel}:{node.lineno}")
            elif node.attr == "shutdown" and "nvml" in ast.unparse(node.value).lower() \
                    and rel != "powerbudgetd/hw/nvmlscope.py":
                found.append(f"{rel}:{node.lineno}")
    return found


def test_only_the_nvml_scope_shuts_nvml_down() -> None:
    assert nvml_shutdown_callers(sorted((ROOT / "powerbudgetd").rglob("*.py"))) == []


def test_the_shutdown_check_finds_a_bare_and_a_deadlined_shutdown(tmp_path: Path) -> None:
    (tmp_path / "powerbudgetd").mkdir()
    cmd = tmp_path / "powerbudgetd" / "cmd.py"
    cmd.write_text("def a(nvml, lib):\n    nvml.shutdown()\n"
                   "    DeadlineCalls(2.0).call('shutdown', self.nvml.shutdown)\n"
                   "    lib.nvmlShutdown()\n    client.shutdown()\n")
    assert nvml_shutdown_callers([cmd], tmp_path) == ["powerbudgetd/cmd.py:2", "powerbudgetd/cmd.py:3",
                                                      "powerbudgetd/cmd.py:4"]
