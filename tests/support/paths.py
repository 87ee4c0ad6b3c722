"""Where the repository's own files are, for tests that read them (the unit, the example
config, the source tree)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def manual_files() -> list[Path]:
    """Every page a user reads: the README, CONTRIBUTING and the site under ``docs/``."""
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]


def manual() -> str:
    """The whole manual as one text, for tests that check what it says."""
    return "\n\n".join(p.read_text() for p in manual_files())
