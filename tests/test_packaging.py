"""Packaging: the build requirements hold at their stated minimum, the offline
wheelhouse installs with no index, and the version comes from one place.

The two slow tests download from the package index (setuptools at its minimum, the
runtime dependencies); the offline install itself runs with pip's configuration and
network cut off, so it can only succeed from the wheelhouse.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
from support.rig import card
from powerbudgetd_sim.libnvml import Fault, SimNvmlLibrary
from powerbudgetd_sim.physics import SimBank

import powerbudgetd
from powerbudgetd import cli
from powerbudgetd.errors import NvmlNotInitialized
from powerbudgetd.hw import nvml as nvml_layer

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
NETWORK_STEP_TIMEOUT_S = 600  # a slow index; pip retries on its own
# Where each source folder lands in the wheel (pyproject's package-dir).
SOURCE_ROOTS = {"powerbudgetd": "powerbudgetd", "sim": "powerbudgetd_sim"}


def _run(cmd: list[str | Path], *, timeout_s: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], check=False, capture_output=True, text=True, timeout=timeout_s, **kw)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc


def _venv(path: Path) -> Path:
    """A fresh virtual environment (with pip, nothing else); returns its bin/."""
    _run([sys.executable, "-m", "venv", path])
    return path / "bin"


def _offline_env() -> dict[str, str]:
    """This environment without pip's configuration (no find-links, index or cache)
    and with every proxy pointing at a closed port: a download attempt fails."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("PIP_", "PYTHON"))}
    dead = "http://127.0.0.1:9"
    env.update(
        PIP_CONFIG_FILE=os.devnull, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
        http_proxy=dead, https_proxy=dead, HTTP_PROXY=dead, HTTPS_PROXY=dead, ALL_PROXY=dead,
    )
    env.pop("no_proxy", None)
    env.pop("NO_PROXY", None)
    return env


def _min_setuptools() -> str:
    """The lowest setuptools [build-system] allows, e.g. "61"."""
    (req,) = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    m = re.fullmatch(r"setuptools>=([0-9.]+)", req.replace(" ", ""))
    assert m, f"[build-system] requires {req!r}: expected setuptools>=N"
    return m.group(1)


def _release(version: str) -> tuple[int, ...]:
    """"61" and "61.0.0" alike: (61,)."""
    parts = [int(x) for x in version.split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _expected_wheel_files() -> set[str]:
    """Every file of the two source trees, as the wheel must name it."""
    out = set()
    for src, pkg in SOURCE_ROOTS.items():
        for path in (ROOT / src).rglob("*"):
            rel = path.relative_to(ROOT / src)
            if path.is_file() and "__pycache__" not in rel.parts and not rel.name.startswith("."):
                out.add(f"{pkg}/{rel.as_posix()}")
    return out


# -- one source of truth: version, Python versions -----------------------------------


def test_version_has_one_source() -> None:
    assert "version" not in PYPROJECT["project"]
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "powerbudgetd.__version__"}
    # The installed metadata was built from that attribute.
    assert importlib.metadata.version("powerbudgetd") == powerbudgetd.__version__


def test_python_versions_agree_with_ci() -> None:
    project = PYPROJECT["project"]
    listed = sorted(
        tuple(int(x) for x in m.group(1).split("."))
        for c in project["classifiers"]
        if (m := re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c))
    )
    assert listed, "no Programming Language :: Python :: 3.N classifier"
    m = re.fullmatch(r">=(3\.\d+)", project["requires-python"])
    assert m, project["requires-python"]
    assert tuple(int(x) for x in m.group(1).split(".")) == listed[0], "requires-python must start at the oldest classifier"
    # CI runs this suite: the interpreter it runs on is one the classifiers promise.
    assert sys.version_info[:2] in listed, f"Python {sys.version_info[:2]} is tested but not in the classifiers {listed}"
    # README says the same.
    readme = (ROOT / "README.md").read_text()
    versions = ", ".join(".".join(map(str, v)) for v in listed)
    assert f"Python {versions}" in readme, f"README's install section must name Python {versions}"
    # and CI tests each: the machine's python3 with the whole suite, the others it names
    # with the quick profile (.ci/run fails when one of them is missing).
    ci = (ROOT / ".ci" / "run").read_text()
    m = re.search(r"^OTHER_PYTHONS=\(([0-9. ]+)\)", ci, re.MULTILINE)
    assert m, ".ci/run names no OTHER_PYTHONS"
    others = sorted(tuple(int(x) for x in v.split(".")) for v in m.group(1).split())
    assert [listed[0], *others] == listed, (others, listed)  # the oldest runs the whole suite


def test_license_form_builds_on_the_minimum() -> None:
    project = PYPROJECT["project"]
    # A string (PEP 639) needs setuptools >= 77, the table form is deprecated: neither.
    assert "license" not in project
    assert "License :: OSI Approved :: MIT License" in project["classifiers"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


# -- --version ------------------------------------------------------------------------


def test_driver_version_from_nvml() -> None:
    lib = SimNvmlLibrary(SimBank([card(0)], seed=1), driver="550.54.15")
    assert nvml_layer.query_driver_version(lib) == "550.54.15"
    assert not lib.initialized  # NVML was shut down again


def test_driver_version_without_a_driver() -> None:
    lib = SimNvmlLibrary(SimBank([card(0)], seed=1), faults=[Fault("nvmlInit", "DRIVER_NOT_LOADED")])
    with pytest.raises(NvmlNotInitialized, match="Driver Not Loaded") as info:
        nvml_layer.query_driver_version(lib)
    assert info.value.code == 9  # NVML_ERROR_DRIVER_NOT_LOADED


def test_driver_version_with_a_broken_library() -> None:
    class Broken(SimNvmlLibrary):
        def attach(self, module: Any) -> None:  # as a library built for another driver
            raise OSError("libnvidia-ml.so.1: undefined symbol: nvmlInit_v2")

    with pytest.raises(NvmlNotInitialized, match="OSError: libnvidia-ml"):
        nvml_layer.query_driver_version(Broken(SimBank([card(0)], seed=1)))


def test_driver_version_does_not_hang_on_a_stuck_driver() -> None:
    release = threading.Event()

    class Stuck(SimNvmlLibrary):
        def nvmlInitWithFlags(self, flags: int) -> int:
            release.wait(30)  # a wedged GPU holds nvmlInit, inside the C call
            return super().nvmlInitWithFlags(flags)

    t0 = time.monotonic()
    try:
        with pytest.raises(NvmlNotInitialized, match="did not answer within 0.3 s"):
            nvml_layer.query_driver_version(Stuck(SimBank([card(0)], seed=1)), timeout_s=0.3)
        assert time.monotonic() - t0 < 2.0
    finally:
        release.set()


@pytest.mark.parametrize("driver", ["550.54.15", None])
def test_version_option_names_all_three(
    driver: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fake_query(library: Any = None, timeout_s: float = 5.0) -> str:
        if driver is None:
            raise NvmlNotInitialized("nvmlInit: NVML Shared Library Not Found", code=12)
        return driver

    monkeypatch.setattr(nvml_layer, "query_driver_version", fake_query)
    assert cli.main(["--version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"powerbudgetd {powerbudgetd.__version__} (Python ")
    assert lines[1] == f"nvidia-ml-py {importlib.metadata.version('nvidia-ml-py')}"
    if driver:
        assert lines[2] == "NVIDIA driver 550.54.15"
    else:
        assert lines[2] == "NVIDIA driver: no NVML (nvmlInit: NVML Shared Library Not Found)"


def test_version_option_on_this_host() -> None:
    # Real NVML, whatever this host has: a GPU, or none (then "no NVML", at once).
    t0 = time.monotonic()
    proc = _run([sys.executable, "-m", "powerbudgetd", "--version"], timeout_s=30)
    assert time.monotonic() - t0 < 15
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith(f"powerbudgetd {powerbudgetd.__version__}")
    assert re.fullmatch(r"NVIDIA driver( \d+(\.\d+)+|: no NVML \(.+\))", lines[2]), lines[2]


# -- builds ---------------------------------------------------------------------------


@pytest.mark.slow
def test_builds_with_the_oldest_stated_setuptools(tmp_path: Path) -> None:
    minimum = _min_setuptools()
    bin_ = _venv(tmp_path / "build-env")
    # wheel < 0.46: later ones no longer carry bdist_wheel for setuptools < 70.1.
    _run([bin_ / "pip", "install", "-q", f"setuptools=={minimum}", "wheel<0.46"], timeout_s=NETWORK_STEP_TIMEOUT_S)
    got = _run([bin_ / "python", "-c", "import setuptools; print(setuptools.__version__)"]).stdout.strip()
    assert _release(got) == _release(minimum), f"built with setuptools {got}, not {minimum}"
    # A copy of the tree: the build writes build/ and *.egg-info next to the sources.
    src = tmp_path / "src"
    for name in SOURCE_ROOTS:
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    out = tmp_path / "dist"
    _run([bin_ / "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "--no-index", "-w", out, src],
         env=_offline_env())
    (whl,) = out.glob("powerbudgetd-*.whl")
    assert whl.name == f"powerbudgetd-{powerbudgetd.__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(whl).namelist())
    missing = _expected_wheel_files() - names
    assert not missing, f"left out of the wheel: {sorted(missing)} (pyproject's packages / package-data)"
    dist_info = f"powerbudgetd-{powerbudgetd.__version__}.dist-info"
    assert any(n.startswith(dist_info) and n.endswith("LICENSE") for n in names)
    meta = zipfile.ZipFile(whl).read(f"{dist_info}/METADATA").decode()
    assert f"Version: {powerbudgetd.__version__}\n" in meta
    assert f"Requires-Python: {PYPROJECT['project']['requires-python']}\n" in meta
    assert "Classifier: License :: OSI Approved :: MIT License\n" in meta
    assert "[console_scripts]\npowerbudgetd = powerbudgetd.cli:main" in zipfile.ZipFile(whl).read(
        f"{dist_info}/entry_points.txt"
    ).decode()


@pytest.mark.slow
def test_offline_install_from_the_wheelhouse(tmp_path: Path) -> None:
    house = tmp_path / "wheels"
    # On the connected side (uses the network and this machine's pip configuration).
    _run([ROOT / "scripts/wheelhouse", house], timeout_s=NETWORK_STEP_TIMEOUT_S,
         env={**os.environ, "PYTHON": sys.executable})
    _run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=house)
    sums = (house / "SHA256SUMS").read_text()
    for name in ("powerbudgetd.toml", "powerbudgetd.service"):  # the host needs no checkout
        assert (house / name).read_bytes() == next(ROOT.glob(f"*/{name}")).read_bytes()
        assert f"  {name}\n" in sums

    # On the GPU host: a fresh venv, no index, no configuration, no network.
    bin_ = _venv(tmp_path / "opt-powerbudgetd")
    offline = _offline_env()
    _run([bin_ / "pip", "install", "--no-index", "--find-links", house, "powerbudgetd"], env=offline)
    where = _run([bin_ / "python", "-c", "import powerbudgetd, powerbudgetd_sim; print(powerbudgetd.__file__)"],
                 cwd=tmp_path, env=offline).stdout
    assert Path(where.strip()).is_relative_to(tmp_path / "opt-powerbudgetd"), where

    version = _run([bin_ / "powerbudgetd", "--version"], cwd=tmp_path, env=offline, timeout_s=30).stdout
    lines = version.splitlines()
    assert lines[0].startswith(f"powerbudgetd {powerbudgetd.__version__} (Python ")
    (nvml_whl,) = house.glob("nvidia_ml_py-*.whl")
    assert lines[1] == f"nvidia-ml-py {nvml_whl.name.split('-')[1]}"
    assert lines[2].startswith("NVIDIA driver")

    sim = _run([bin_ / "powerbudgetd", "simulate", "--duration", "10"], cwd=tmp_path, env=offline).stdout
    assert "10 s simulated" in sim
    assert re.search(r"violation ticks\s+0 of \d+", sim), sim
