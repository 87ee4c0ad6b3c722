"""``powerbudgetd pod``, the container's entrypoint, as processes.

The driver root is a folder laid out as a host's (or the GPU operator's driver
container's) would be, holding the null driver (``powerbudgetd_sim.nulldriver``, a C
NVML library) behind an absolute symlink, as a distribution installs it: found, it is
loaded by nvidia-ml-py's own loader through ``LD_LIBRARY_PATH``; missing, the error
names every place looked in; a library of the wrong version (one whose nvmlInit answers
LIB_RM_VERSION_MISMATCH, as after a driver upgrade) fails with the daemon's own advice.
The simulated bank (``--backend sim``, kept in a state file) shows the driver-ready wait
touching nothing, and SIGTERM (or the preStop hook, ``pod stop``) running the daemon's
stop and then the failsafe within the DaemonSet's grace period.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from powerbudgetd_sim import nulldriver

from support.daemon import clean_env, json_lines
from support.paths import REPO
from support.wait import reap, wait_until

from powerbudgetd.errors import ExitStatus
from powerbudgetd.service.pod import LIBRARY_DIRS, DriverNotFound, find_library, resolve_in_root

DAEMONSET = REPO / "deploy" / "kubernetes" / "base" / "daemonset.yaml"
LIBDIR = "usr/lib/x86_64-linux-gnu"


def grace_period_s() -> float:
    return float(yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])


@pytest.fixture(scope="module")
def null_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return nulldriver.build(tmp_path_factory.mktemp("nulldriver"))


def driver_root(tmp_path: Path, library: Path) -> Path:
    """A root with the library at its versioned name and ``libnvidia-ml.so.1`` an
    absolute link to it (absolute within the root: this machine has no such file)."""
    root = tmp_path / "driver-root"
    (root / LIBDIR).mkdir(parents=True)
    versioned = root / LIBDIR / "libnvidia-ml.so.0.0.null"
    versioned.write_bytes(library.read_bytes())
    (root / LIBDIR / "libnvidia-ml.so.1").symlink_to(f"/{LIBDIR}/libnvidia-ml.so.0.0.null")
    assert not Path(f"/{LIBDIR}/libnvidia-ml.so.0.0.null").exists()
    return root


class Pod:
    """``powerbudgetd pod ARGS`` as a container's PID 1 would run, its output in a file."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str]) -> None:
        self.log = tmp_path / "pod.log"
        self.env = clean_env(RUNTIME_DIRECTORY=str(tmp_path / "run"), **env)
        self.env.pop("LD_LIBRARY_PATH", None)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "powerbudgetd", "pod", *args], stdout=out,
                                         stderr=subprocess.STDOUT, env=self.env)

    def events(self, name: str | None = None) -> list[dict]:
        return [e for e in json_lines(self.log.read_text(errors="replace")) if name is None or e.get("event") == name]

    def wait_for(self, name: str, timeout_s: float = 60) -> dict:
        return wait_until(lambda: (self.events(name) or [None])[0], timeout_s, name, proc=self.proc,
                          log=lambda: self.log.read_text()[-3000:])

    def __enter__(self) -> Pod:
        return self

    def __exit__(self, *exc: object) -> None:
        reap(self.proc)


def sim_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "pb.toml"
    cfg.write_text(f"budget_w = 1000\n[recorder]\ndir = '{tmp_path / 'rec'}'\n[metrics]\nenabled = false\n"
                   f"[sim]\nscenario = 'workstation-4'\nlag_s = 0.1\nstate_file = '{tmp_path / 'cards.json'}'\n")
    return cfg


def limits_w(state: Path) -> list[float]:
    return [c["requested_mw"] / 1000 for c in json.loads(state.read_text())["cards"]]


# -- driver root discovery -------------------------------------------------------------

def test_the_library_is_found_through_links_read_inside_the_root(tmp_path: Path, null_library: Path) -> None:
    root = driver_root(tmp_path, null_library)
    (root / "lib64").symlink_to("/usr/lib/../../../lib64-elsewhere")  # '..' stops at the root
    found = find_library(root)
    assert found == root / LIBDIR / "libnvidia-ml.so.0.0.null"
    assert resolve_in_root(root, "lib64/libnvidia-ml.so.1") is None


def test_a_missing_library_names_the_root_and_every_place_looked(tmp_path: Path) -> None:
    with pytest.raises(DriverNotFound) as err:
        find_library(tmp_path, "CONTAINER_DRIVER_ROOT")
    text = str(err.value)
    assert str(tmp_path) in text and "CONTAINER_DRIVER_ROOT" in text and "NVIDIA_DRIVER_ROOT" in text
    assert all(str(tmp_path / d) in text for d in LIBRARY_DIRS)


def test_pod_run_loads_the_found_library_and_sigterm_runs_the_failsafe(tmp_path: Path, null_library: Path) -> None:
    root = driver_root(tmp_path, null_library)
    cfg = tmp_path / "pb.toml"
    cfg.write_text(f"budget_w = 1600\n[recorder]\ndir = '{tmp_path / 'rec'}'\n[metrics]\nenabled = false\n")
    env = {"CONTAINER_DRIVER_ROOT": str(root), "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver", "NULLNVML_CARDS": "4"}
    with Pod(tmp_path, "run", "--config", str(cfg), env=env) as pod:
        found = pod.wait_for("pod_driver_found")
        assert found["library"] == str(root / LIBDIR / "libnvidia-ml.so.0.0.null")
        ready = pod.wait_for("ready")
        assert ready["sum_limits_w"] <= 1600
        t0 = time.monotonic()
        pod.proc.send_signal(signal.SIGTERM)
        assert pod.proc.wait(timeout=grace_period_s()) == 0
        took = time.monotonic() - t0
    names = [e["event"] for e in pod.events()]
    assert names.index("stopped") < names.index("pod_daemon_exited") < names.index("failsafe_done") \
        < names.index("pod_failsafe_done")
    assert pod.events("pod_failsafe_done")[0]["status"] == 0
    assert took < grace_period_s()


def test_pod_run_without_the_library_says_where_it_looked(tmp_path: Path) -> None:
    (tmp_path / "empty-root").mkdir()
    with Pod(tmp_path, "run", env={"CONTAINER_DRIVER_ROOT": str(tmp_path / "empty-root")}) as pod:
        assert pod.proc.wait(timeout=60) == ExitStatus.NVML
    text = pod.log.read_text()
    assert "libnvidia-ml.so.1 not found under the driver root" in text and str(tmp_path / "empty-root" / LIBDIR) in text
    assert not pod.events("starting")


def test_a_library_of_the_wrong_version_fails_with_the_drivers_advice(tmp_path: Path) -> None:
    src = tmp_path / "old.c"
    # A user-space library that does not match the kernel module (a driver upgraded
    # without a reboot): NVML_ERROR_LIB_RM_VERSION_MISMATCH from every nvmlInit.
    src.write_text("int nvmlInitWithFlags(unsigned f) { (void)f; return 18; }\nint nvmlInit_v2(void) { return 18; }\n"
                   "int nvmlShutdown(void) { return 0; }\n"
                   "const char *nvmlErrorString(int r) { (void)r; return \"RM has detected an NVML/RM version mismatch.\"; }\n")
    root = tmp_path / "root"
    (root / "usr/lib64").mkdir(parents=True)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(root / "usr/lib64/libnvidia-ml.so.1"), str(src)], check=True)
    cfg = tmp_path / "pb.toml"
    cfg.write_text(f"budget_w = 1000\nnvml_init_attempts = 1\n[recorder]\ndir = '{tmp_path / 'rec'}'\n"
                   "[metrics]\nenabled = false\n")
    with Pod(tmp_path, "run", "--config", str(cfg), env={"CONTAINER_DRIVER_ROOT": str(root)}) as pod:
        assert pod.proc.wait(timeout=60) == ExitStatus.NVML
    assert pod.events("pod_driver_found")[0]["library"] == str(root / "usr/lib64/libnvidia-ml.so.1")
    (err,) = pod.events("nvml_unavailable")
    assert "old kernel module" in err["action"]


# -- the driver-ready wait, and the stop --------------------------------------------------

def test_nothing_touches_the_cards_until_the_driver_is_ready(tmp_path: Path) -> None:
    cfg, ready_file = sim_config(tmp_path), tmp_path / "validations" / "driver-ready"
    with Pod(tmp_path, "run", "--backend", "sim", "--config", str(cfg), "--wait-for", str(ready_file), env={}) as pod:
        pod.wait_for("pod_waiting_for_driver")
        time.sleep(1.0)
        assert not (tmp_path / "cards.json").exists() and not pod.events("starting")
        ready_file.parent.mkdir()
        ready_file.touch()
        pod.wait_for("pod_driver_ready")
        pod.wait_for("ready")
        pod.proc.send_signal(signal.SIGTERM)
        assert pod.proc.wait(timeout=grace_period_s()) == 0


def test_sigterm_while_waiting_for_the_driver_leaves_at_once(tmp_path: Path) -> None:
    cfg = sim_config(tmp_path)
    with Pod(tmp_path, "run", "--backend", "sim", "--config", str(cfg), "--wait-for", str(tmp_path / "never"), env={}) as pod:
        pod.wait_for("pod_waiting_for_driver")
        pod.proc.send_signal(signal.SIGTERM)
        assert pod.proc.wait(timeout=10) == 0
    assert not pod.events("pod_failsafe_done") and not (tmp_path / "cards.json").exists()


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_a_daemon_that_dies_leaves_the_failsafe_to_lower_the_cards(tmp_path: Path) -> None:
    cfg = sim_config(tmp_path)
    with Pod(tmp_path, "run", "--backend", "sim", "--config", str(cfg), env={}) as pod:
        pod.wait_for("ready")
        # the simulated bank lends: wait for a card above its 250 W share, then kill the daemon
        wait_until(lambda: (tmp_path / "cards.json").exists() and max(limits_w(tmp_path / "cards.json")) > 250,
                   60, "a card lent above its share", proc=pod.proc)
        (daemon,) = _children(pod.proc.pid)
        os.kill(daemon, signal.SIGKILL)
        pod.wait_for("pod_failsafe_done")
        assert pod.proc.wait(timeout=30) == 128 + signal.SIGKILL  # the daemon's end, as a shell reports it
    assert max(limits_w(tmp_path / "cards.json")) <= 250.0
    assert pod.events("pod_failsafe_done")[0]["status"] == 0


def test_the_prestop_hook_stops_the_pod_and_waits_for_its_failsafe(tmp_path: Path) -> None:
    cfg = sim_config(tmp_path)
    with Pod(tmp_path, "run", "--backend", "sim", "--config", str(cfg), env={}) as pod:
        pod.wait_for("ready")
        hook = subprocess.run([sys.executable, "-m", "powerbudgetd", "pod", "stop"], env=pod.env,
                              capture_output=True, text=True, timeout=grace_period_s())
        assert hook.returncode == 0, hook.stderr
        assert pod.events("pod_failsafe_done"), "the hook returned before the failsafe ran"
        assert pod.proc.wait(timeout=10) == 0


def test_the_wait_for_the_driver_says_so_every_progress_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from structlog.testing import capture_logs

    from powerbudgetd.service import pod

    monkeypatch.setattr(pod, "PROGRESS_S", 0.3)
    ready = tmp_path / "driver-ready"
    timer = threading.Timer(1.2, ready.touch)
    with capture_logs() as logs:
        timer.start()
        try:
            assert pod.wait_for_file(ready, pod._Stop(), timeout_s=30)
        finally:
            timer.cancel()
        assert not pod.wait_for_file(tmp_path / "never", pod._Stop(), timeout_s=0.5)
    events = [(e["event"], e.get("waited_s")) for e in logs]
    first = events[:[name for name, _ in events].index("pod_driver_ready")]
    waits = [w for name, w in first if name == "pod_waiting_for_driver"]
    (done,) = [w for name, w in events if name == "pod_driver_ready"]
    assert done is not None and done >= 1.2
    # The first line, then one each 0.3 s (polled every 0.2 s) until the file appeared
    # (the timer that makes it may fire late on a loaded machine: counted to when it did).
    assert waits[0] is None and len(waits) >= 3
    assert waits[1:] == sorted(waits[1:]) and all(0.3 <= w <= done for w in waits[1:])
    assert all(b - a >= 0.2 - 1e-9 for a, b in zip(waits[1:], waits[2:]))  # 0.3 s apart, logged to 0.1 s
    (gave_up,) = [w for name, w in events if name == "pod_driver_not_ready"]
    assert gave_up is not None and gave_up >= 0.5


def test_a_daemon_that_ignores_the_stop_is_killed_and_the_failsafe_still_runs(tmp_path: Path) -> None:
    cfg = sim_config(tmp_path)
    with Pod(tmp_path, "run", "--backend", "sim", "--config", str(cfg), "--stop-timeout", "2", env={}) as pod:
        pod.wait_for("ready")
        wait_until(lambda: (tmp_path / "cards.json").exists() and max(limits_w(tmp_path / "cards.json")) > 250,
                   60, "a card lent above its share", proc=pod.proc)
        (daemon,) = _children(pod.proc.pid)
        os.kill(daemon, signal.SIGSTOP)  # hung: it cannot act on SIGTERM
        t0 = time.monotonic()
        pod.proc.send_signal(signal.SIGTERM)
        assert pod.proc.wait(timeout=grace_period_s()) == 128 + signal.SIGKILL
        took = time.monotonic() - t0
    assert pod.events("pod_daemon_stop_timeout")[0]["after_s"] == 2
    assert pod.events("pod_failsafe_done")[0]["status"] == 0
    assert max(limits_w(tmp_path / "cards.json")) <= 250.0
    assert 2 <= took < grace_period_s()


def test_pod_restore_gives_back_the_limits_found_then_idles(tmp_path: Path) -> None:
    from powerbudgetd.service.backend import make_nvml

    found_w = (300.0, 280.0, 260.0, 240.0)  # set by hand before the first start: 1080 W
    nvml = make_nvml("sim", "workstation-4", state_file=str(tmp_path / "cards.json"))
    nvml.init()
    for device, w in zip(nvml.devices(), found_w):
        nvml.set_power_limit(device.uuid, w)
    nvml.shutdown()
    cfg = sim_config(tmp_path)
    cfg.write_text(cfg.read_text().replace("budget_w = 1000", "budget_w = 1100"))
    with Pod(tmp_path, "run", "--backend", "sim", "--config", str(cfg), env={}) as pod:
        pod.wait_for("ready")
        pod.proc.send_signal(signal.SIGTERM)
        assert pod.proc.wait(timeout=grace_period_s()) == 0
    assert max(limits_w(tmp_path / "cards.json")) <= 275.0  # the failsafe's share
    (tmp_path / "pod.log").rename(tmp_path / "run.log")
    # the restore component's command: the overlay's own arguments, `restore` for `run`
    ready = tmp_path / "restored"
    with Pod(tmp_path, "restore", "--backend", "sim", "--config", str(cfg), "--stop-timeout", "30",
             "--ready-file", str(ready), env={}) as pod:
        done = pod.wait_for("pod_restore_done")
        assert done["status"] == 0
        assert limits_w(tmp_path / "cards.json") == list(found_w)
        wait_until(ready.exists, 5, "the pod ready once restored", proc=pod.proc)
        time.sleep(0.5)
        assert pod.proc.poll() is None, "a DaemonSet's pod must idle, not exit and be restarted"
        pod.proc.send_signal(signal.SIGTERM)
        assert pod.proc.wait(timeout=10) == 0
    assert "restored 4 card(s)" in pod.log.read_text()


# -- readiness: the pod is ready once the daemon is ---------------------------------------

def test_the_ready_file_follows_the_daemons_ready_and_its_stop(tmp_path: Path) -> None:
    cfg, driver, ready = sim_config(tmp_path), tmp_path / "driver-ready", tmp_path / "ready"
    ready.touch()  # a stale one is not believed
    with Pod(tmp_path, "run", "--backend", "sim", "--config", str(cfg), "--wait-for", str(driver),
             "--ready-file", str(ready), env={}) as pod:
        pod.wait_for("pod_waiting_for_driver")
        assert not ready.exists()
        driver.touch()
        wait_until(ready.exists, 60, "the ready file", proc=pod.proc)
        assert pod.events("ready"), "ready before the daemon's READY=1"
        pod.proc.send_signal(signal.SIGTERM)
        assert pod.proc.wait(timeout=grace_period_s()) == 0
    assert not ready.exists()
    names = [e["event"] for e in pod.events()]
    assert names.index("ready") < names.index("pod_ready") < names.index("pod_not_ready") \
        < names.index("pod_failsafe_done")


def test_a_boot_that_fails_never_makes_the_pod_ready(tmp_path: Path) -> None:
    # as in test_node_gate: card 1 refuses every write at 300 W, 750 W needed under 700 W
    (tmp_path / "bank.toml").write_text('bank = "workstation-4"\nlag_s = 0.1\n[[faults]]\n'
                                        'call = "nvmlDeviceSetPowerManagementLimit"\nerror = "UNKNOWN"\ncard = 1\n')
    cfg = tmp_path / "pb.toml"
    cfg.write_text(f"budget_w = 700\n[recorder]\ndir = '{tmp_path / 'rec'}'\n[metrics]\nenabled = false\n"
                   f"[sim]\nscenario = '{tmp_path / 'bank.toml'}'\n[control]\nboot_timeout_s = 2\n")
    ready = tmp_path / "ready"
    with Pod(tmp_path, "run", "--backend", "sim", "--config", str(cfg), "--ready-file", str(ready), env={}) as pod:
        assert pod.proc.wait(timeout=60) == ExitStatus.BOOT_OVER_BUDGET
    assert not ready.exists() and not pod.events("pod_ready") and not pod.events("ready")
    assert pod.events("pod_failsafe_done")
