"""The layout's rules, checked on the source: which package may import which, and the
few things there must be exactly one of. A broken rule fails here, naming the line."""

from __future__ import annotations

import ast
import subprocess
import sys
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


def _layer(module: str) -> str:
    """``powerbudgetd.core.policy`` -> ``core``; ``powerbudgetd.config`` stays
    whole where a rule names it; ``powerbudgetd`` or ``powerbudgetd.cli`` -> ``""``."""
    parts = module.split(".")[1:]
    if not parts or parts[0] in ("cli", "__main__", "__init__"):
        return ""
    return parts[0]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts)


def _imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported module, at module level) for every import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    top = set()
    for node in tree.body:
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks do not run
            continue
        top.add(id(node))
    out = []
    pkg = _module_name(path).rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([mod] if mod else []))
            if mod == "powerbudgetd":  # `from powerbudgetd import __version__`
                out += [(node.lineno, f"powerbudgetd.{a.name}" if a.name != "__version__" else "powerbudgetd",
                         id(node) in top) for a in node.names]
            else:
                out.append((node.lineno, mod, id(node) in top))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            out.append((node.lineno, str(node.args[0].value), False))  # importlib.import_module("...")
    return out


def _product_files() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_each_package_imports_only_what_its_rule_allows() -> None:
    broken = []
    for path in _product_files():
        layer = _layer(_module_name(path))
        for line, mod, at_top in _imports(path):
            if mod.startswith("powerbudgetd_sim") and at_top:
                broken.append(f"{path.relative_to(ROOT)}:{line} imports the simulator at module level")
            if not mod.startswith("powerbudgetd."):
                continue  # third party, or `from powerbudgetd import __version__`
            if not at_top and layer in ("", "service"):
                continue  # the composition root may import lazily what a command asks for
            target = _layer(mod)
            if target not in ALLOWED[layer] and (layer, mod) not in PENDING:
                broken.append(f"{path.relative_to(ROOT)}:{line} ({layer or 'top'}) imports {mod}")
    assert not broken, "import rules broken:\n" + "\n".join(broken)


def test_one_module_imports_pynvml() -> None:
    importers = {
        str(path.relative_to(ROOT))
        for path in _product_files()
        for _, mod, _ in _imports(path)
        if mod.split(".")[0] == "pynvml"
    }
    assert importers == {"powerbudgetd/hw/nvml.py"}


def test_one_module_imports_aiomqtt() -> None:
    importers = {
        str(path.relative_to(ROOT))
        for path in _product_files()
        for _, mod, _ in _imports(path)
        if mod.split(".")[0] == "aiomqtt"
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
