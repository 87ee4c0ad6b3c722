"""The layout's rules, checked on the source: which package may import which, and the
few things there must be exactly one of. A broken rule fails here, naming the line."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "powerbudgetd"

# package -> what its modules may import at module level, besides the standard library
# and third-party libraries. "" is the top-level package (powerbudgetd/__init__, cli, ...).
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "core": {"core", "errors"},
    "config": {"core", "errors", "config"},
    "hw": {"core", "errors", "hw"},
    "control": {"core", "errors", "hw", "control"},
    "powerlog": {"core", "errors", "config", "powerlog"},
    "channels": {"core", "errors", "config", "hw", "control", "powerlog", "channels"},
    "service": {"core", "errors", "config", "hw", "control", "powerlog", "channels", "service"},
    "": {"core", "errors", "config", "hw", "control", "powerlog", "channels", "service", ""},
}
ALLOWED["powerlog"] |= {"control"}  # the recorder reads the tick report (types only)

# Edges still to be cut. This list only shrinks (the side-channel protocol emptied it:
# channels and the recorder are registered with the daemon and never import it).
PENDING: set[tuple[str, str]] = set()


# The simulator (sim/, package powerbudgetd_sim) drives the controller: it may import
# these layers of the product, never the service, the channels or the command line.
SIM_ALLOWED = {"core", "config", "control", "hw", "errors", "powerlog"}
# One module besides: the shared-meter simulation (sim/sharedmeter.py) closes each host's
# loop through the daemon's own UPS channel, fed through its public hooks on virtual time
# (``bank`` each tick, ``variables`` each poll; it starts no I/O), so the figures it prints
# are the daemon's and not a model's.
SIM_ALLOWED_MODULES = {"powerbudgetd.channels.ups"}

# core/ is pure arithmetic: no clock, no I/O, no logging, no concurrency.
CORE_FORBIDDEN = {"time", "datetime", "os", "io", "pathlib", "shutil", "tempfile", "logging", "structlog",
                  "asyncio", "threading", "concurrent", "multiprocessing", "subprocess", "socket", "select",
                  "signal", "sys", "urllib", "http"}


@dataclass(frozen=True)
class Import:
    """One import statement's target: ``module`` (resolved, absolute), the ``names`` it
    takes from it (``from module import names``; empty for ``import module``), and
    whether it runs when the module is imported (not in a function, not under
    ``if TYPE_CHECKING:``; under any other top-level ``if`` or ``try`` it does)."""

    line: int
    module: str
    names: tuple[str, ...]
    at_top: bool


def _layer(module: str) -> str:
    """``powerbudgetd.core.policy`` -> ``core``; ``powerbudgetd.config`` stays
    whole where a rule names it; ``powerbudgetd`` or ``powerbudgetd.cli`` -> ``""``."""
    parts = module.split(".")[1:]
    if not parts or parts[0] in ("cli", "__main__", "__init__"):
        return ""
    return parts[0]


def _module_name(path: Path, root: Path = ROOT) -> str:
    """The module a source file is imported as: sim/ installs as ``powerbudgetd_sim``;
    a package's ``__init__.py`` is the package itself."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[0] == "sim":
        parts[0] = "powerbudgetd_sim"
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package(path: Path, root: Path = ROOT) -> str:
    """The package a source file belongs to (an ``__init__.py``: its own)."""
    name = _module_name(path, root)
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runs_at_import(tree: ast.Module) -> set[int]:
    """ids of the nodes that run when the module is imported."""
    ids: set[int] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and _type_checking(child.test):
                body: list[ast.AST] = list(child.orelse)  # the else branch does run
            else:
                ids.add(id(child))
                body = [child]
                visit(child)
                continue
            for n in body:
                ids.add(id(n))
                visit(n)

    visit(tree)
    return ids


def _imports(path: Path, root: Path = ROOT) -> list[Import]:
    """Every import in ``path`` (``importlib.import_module("...")`` too, as lazy)."""
    tree = ast.parse(path.read_text(), str(path))
    top = _runs_at_import(tree)
    pkg = _package(path, root)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Import(node.lineno, a.name, (), id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([mod] if mod else []))
            out.append(Import(node.lineno, mod, tuple(a.name for a in node.names), id(node) in top))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            out.append(Import(node.lineno, str(node.args[0].value), (), False))
    return out


def _targets(imp: Import, modules: set[str]) -> list[str]:
    """The modules of the tree an import loads: ``from package import name`` loads the
    package (its ``__init__``) and, where ``name`` is a submodule, that too."""
    found = [imp.module] if imp.module in modules else []
    return found + [f"{imp.module}.{n}" for n in imp.names if f"{imp.module}.{n}" in modules]


def _source_files(root: Path = ROOT) -> list[Path]:
    return sorted((root / "powerbudgetd").rglob("*.py")) + sorted((root / "sim").rglob("*.py"))


def import_cycles(files: list[Path], root: Path = ROOT) -> list[str]:
    """Cycles among the modules of one package, counting every import (under
    ``if TYPE_CHECKING:`` and inside functions too): each as ``a -> b -> a``."""
    names = {_module_name(p, root): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        pkg = _package(path, root)
        graph[name] = {t for imp in _imports(path, root) for t in _targets(imp, set(names))
                       if t != name and _package(names[t], root) == pkg}
    cycles: list[str] = []
    done: set[str] = set()

    def walk(node: str, trail: list[str]) -> None:
        if node in trail:
            loop = trail[trail.index(node):] + [node]
            first = min(range(len(loop) - 1), key=lambda k: loop[k])  # one name per cycle
            text = " -> ".join(loop[first:-1] + loop[:first] + [loop[first]])
            if text not in cycles:
                cycles.append(text)
            return
        if node in done:
            return
        for nxt in sorted(graph[node]):
            walk(nxt, trail + [node])
        done.add(node)

    for name in sorted(graph):
        walk(name, [])
    return cycles


def simulator_imports(files: list[Path], root: Path = ROOT) -> list[str]:
    """Imports from the simulator of a product layer it may not use (every import)."""
    broken = []
    for path in files:
        if not _module_name(path, root).startswith("powerbudgetd_sim"):
            continue
        for imp in _imports(path, root):
            mods = [imp.module] + [f"{imp.module}.{n}" for n in imp.names] if imp.module == "powerbudgetd" else [imp.module]
            for mod in mods:
                if (mod.startswith("powerbudgetd.") and _layer(mod) not in SIM_ALLOWED and mod not in SIM_ALLOWED_MODULES) \
                        or mod == "powerbudgetd.cli":
                    broken.append(f"{path.relative_to(root)}:{imp.line} imports {mod}")
    return broken


def core_impurities(files: list[Path], root: Path = ROOT) -> list[str]:
    """Imports in core/ of a clock, I/O, logging or concurrency module (every import)."""
    return [f"{path.relative_to(root)}:{imp.line} imports {imp.module}"
            for path in files if _layer(_module_name(path, root)) == "core" and _module_name(path, root).startswith("powerbudgetd.")
            for imp in _imports(path, root) if imp.module.split(".")[0] in CORE_FORBIDDEN]


def _product_files() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_each_package_imports_only_what_its_rule_allows() -> None:
    broken = []
    for path in _product_files():
        layer = _layer(_module_name(path))
        for imp in _imports(path):
            if imp.module.startswith("powerbudgetd_sim") and imp.at_top:
                broken.append(f"{path.relative_to(ROOT)}:{imp.line} imports the simulator at module level")
            if not imp.at_top and layer in ("", "service"):
                continue  # the composition root may import lazily what a command asks for
            mods = [f"powerbudgetd.{n}" for n in imp.names if n != "__version__"] if imp.module == "powerbudgetd" \
                else [imp.module]
            for mod in mods:
                if mod.startswith("powerbudgetd.") and _layer(mod) not in ALLOWED[layer] and (layer, mod) not in PENDING:
                    broken.append(f"{path.relative_to(ROOT)}:{imp.line} ({layer or 'top'}) imports {mod}")
    assert not broken, "import rules broken:\n" + "\n".join(broken)


def test_one_module_imports_pynvml() -> None:
    importers = {
        str(path.relative_to(ROOT))
        for path in _product_files()
        for imp in _imports(path)
        if imp.module.split(".")[0] == "pynvml"
    }
    assert importers == {"powerbudgetd/hw/nvml.py"}


def test_one_module_imports_aiomqtt() -> None:
    importers = {
        str(path.relative_to(ROOT))
        for path in _product_files()
        for imp in _imports(path)
        if imp.module.split(".")[0] == "aiomqtt"
    }
    assert importers == {"powerbudgetd/channels/mqtt/session.py"}


def test_cli_and_the_nvml_backend_load_no_simulator_module() -> None:
    code = (
        "import sys\n"
        "import powerbudgetd.cli\n"
        "from powerbudgetd.service.backend import make_nvml\n"
        "try:\n"
        "    make_nvml('nvml')\n"
        "except Exception:\n"
        "    pass\n"  # no NVML here: what matters is what got imported on the way
        "print([m for m in sys.modules if m.startswith('powerbudgetd_sim')])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_no_import_cycle_inside_any_package() -> None:
    assert import_cycles(_source_files()) == []


def test_the_simulator_imports_no_service_channel_or_command_line() -> None:
    assert simulator_imports(_source_files()) == []


def test_core_imports_no_clock_io_logging_or_concurrency() -> None:
    assert core_impurities(_source_files()) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> list[Path]:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return sorted(tmp_path.rglob("*.py"))


def test_the_checks_fail_on_a_cycle_an_upward_simulator_import_and_a_clock_in_core(tmp_path: Path) -> None:
    files = _tree(tmp_path, {
        "powerbudgetd/__init__.py": "",
        "powerbudgetd/control/__init__.py": "",
        "powerbudgetd/control/a.py": "from powerbudgetd.control.b import B\n",
        "powerbudgetd/control/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                     "    from powerbudgetd.control.a import A\n",
        "powerbudgetd/mqtt/__init__.py": "def __getattr__(name):\n    from powerbudgetd.mqtt.session import S\n",
        "powerbudgetd/mqtt/session.py": "from powerbudgetd.mqtt.state import P\n",
        "powerbudgetd/mqtt/state.py": "from powerbudgetd.mqtt import discovery\n",
        "powerbudgetd/mqtt/discovery.py": "",
        "powerbudgetd/core/__init__.py": "",
        "powerbudgetd/core/clocked.py": "import math\nif True:\n    import time\n",
        "sim/__init__.py": "",
        "sim/up.py": "from powerbudgetd.core import plan\nfrom powerbudgetd.service.daemon import Daemon\n",
    })
    assert import_cycles(files, tmp_path) == [
        "powerbudgetd.control.a -> powerbudgetd.control.b -> powerbudgetd.control.a",
        "powerbudgetd.mqtt -> powerbudgetd.mqtt.session -> powerbudgetd.mqtt.state -> powerbudgetd.mqtt",
    ]
    assert simulator_imports(files, tmp_path) == ["sim/up.py:2 imports powerbudgetd.service.daemon"]
    assert core_impurities(files, tmp_path) == ["powerbudgetd/core/clocked.py:3 imports time"]
    (imp,) = [i for i in _imports(tmp_path / "powerbudgetd/core/clocked.py", tmp_path) if i.module == "time"]
    assert imp.at_top  # under a top-level `if` other than TYPE_CHECKING: it runs at import


# Tests are named for what they hold, not for the finding or round that asked for them.
FINDING_NAME = re.compile(r"^test_(case)?\d+(_|$)|^test_case\d+|^test_round\d+")


def finding_named_tests(files: list[Path], root: Path = ROOT) -> list[str]:
    """Each test function (or class) named after a numbered finding, case or round."""
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and FINDING_NAME.match(node.name.lower()):
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    return found


def test_no_test_is_named_after_a_finding_or_a_round() -> None:
    assert finding_named_tests(sorted((ROOT / "tests").rglob("test_*.py"))) == []


def test_the_name_check_finds_numbered_tests(tmp_path: Path) -> None:
    files = _tree(tmp_path, {"tests/test_x.py": "def test_3_durations(): pass\nasync def test_case2_deep(): pass\n"
                                                "def test_round4_x(): pass\ndef test_durations_3_ways(): pass\n"})
    assert finding_named_tests(files, tmp_path) == ["tests/test_x.py:1 test_3_durations", "tests/test_x.py:2 test_case2_deep",
                                                    "tests/test_x.py:3 test_round4_x"]
