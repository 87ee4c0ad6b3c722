"""`log report --last` says what was wrong with a zero window: it is a duration, just not
a positive one (the same words as for a negative one), not "not a duration"."""

from __future__ import annotations

import pytest

from powerbudgetd.cli import main
from powerbudgetd.errors import ExitStatus


@pytest.mark.parametrize("last", ["0s", "0m", "0.0h", "0"])
def test_a_zero_window_is_refused_as_not_positive(tmp_path, capsys, last):
    assert main(["log", "report", "--dir", str(tmp_path), "--last", last]) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert f"must be a positive duration, got {last!r}" in err
    assert "not a duration" not in err


def test_a_word_is_still_not_a_duration(tmp_path, capsys):
    assert main(["log", "report", "--dir", str(tmp_path), "--last", "soon"]) == ExitStatus.CONFIG
    assert "not a duration: 'soon'" in capsys.readouterr().err
