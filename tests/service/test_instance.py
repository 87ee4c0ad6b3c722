"""One daemon per set of cards: the instance lock on the real file system, and a second
``powerbudgetd run`` against the same (simulated, shared) cards refused with its own
exit status, naming the holder's PID (issue case: two daemons fighting over limits)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from powerbudgetd.errors import AlreadyRunning, ExitStatus
from powerbudgetd.service.instance import InstanceLock, lock_path
from support.daemon import DaemonProcess
from support.scenarios import idle_4
from support.configs import config_file

def test_lock_path_by_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path / "run"))
    assert lock_path("nvml", False, None) == tmp_path / "run" / "powerbudgetd.lock"
    monkeypatch.delenv("RUNTIME_DIRECTORY")
    assert lock_path("nvml", False, None) == Path("/run/powerbudgetd/powerbudgetd.lock")
    # a dry run writes nothing: it neither blocks nor waits for the production daemon
    assert lock_path("nvml", True, None) is None
    # a simulated bank is shared only through its state file: the lock sits beside it
    assert lock_path("sim", False, str(tmp_path / "s.json")) == tmp_path / "s.json.lock"
    assert lock_path("sim", False, None) is None
    assert lock_path("sim", True, str(tmp_path / "s.json")) is None


def test_second_lock_names_the_holder_and_release_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "run" / "powerbudgetd.lock"
    first = InstanceLock(path).acquire()
    assert path.read_text() == f"{os.getpid()}\n"
    with pytest.raises(AlreadyRunning) as err:
        InstanceLock(path).acquire()  # a second open file description: flock conflicts
    assert err.value.holder_pid == os.getpid() and f"PID {os.getpid()}" in str(err.value)
    first.release()
    with InstanceLock(path):
        pass


def test_lock_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    link = tmp_path / "powerbudgetd.lock"
    link.symlink_to(victim)
    with pytest.raises(OSError):
        InstanceLock(link).acquire()
    assert victim.read_text() == "keep me\n"


def _config(tmp_path: Path) -> Path:
    scenario = idle_4(tmp_path)
    return config_file(tmp_path, f"[sim]\nscenario = '{scenario}'\nstate_file = '{tmp_path / 'cards.json'}'\n",
                       quiet=True, mode=0o600)


@pytest.mark.slow  # four daemons as subprocesses
def test_second_daemon_on_the_same_cards_exits_naming_the_first(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    with DaemonProcess(cfg, log=tmp_path / "first.log") as first:
        first.wait_for(lambda: (tmp_path / "cards.json").exists(), "the first daemon's first write", step_s=0.1)
        state_before = (tmp_path / "cards.json").stat().st_mtime_ns
        with DaemonProcess(cfg, log=tmp_path / "second.log") as second:
            assert second.wait(30) == ExitStatus.ALREADY_RUNNING
        assert f"PID {first.pid}" in second.errors() and "cards.json.lock" in second.errors()
        assert not second.events("power_limit_set")
        # a dry run beside it is not blocked (and writes nothing)
        with DaemonProcess(cfg, "--dry-run", log=tmp_path / "dry.log") as dry:
            dry.wait_for(lambda: dry.events("ready"), "the dry run ready beside the first")
            assert dry.stop(15) == 0
        assert first.returncode is None
        assert (tmp_path / "cards.json").stat().st_mtime_ns >= state_before
        assert first.stop(20) == 0
    # the lock died with its holder: the next daemon starts
    with DaemonProcess(cfg, log=tmp_path / "again.log") as again:
        again.wait_for(lambda: again.events("ready"), "the next daemon ready")
        assert again.stop(20) == 0
