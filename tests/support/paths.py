"""Where the repository's own files are, for tests that read them (the unit, the example
config, the source tree)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
