"""A usage error is one line on stderr naming what was wrong (and where --help is), exit
2, nothing on stdout; --help still prints the whole usage."""

from __future__ import annotations

import pytest

from support.daemon import cli, no_traceback


@pytest.mark.parametrize("args, words", [
    (["simulate", "--bogus"], ["powerbudgetd: error: unrecognized arguments: --bogus", "(see powerbudgetd --help)"]),
    ([], ["powerbudgetd: error: the following arguments are required: COMMAND"]),
    (["status", "--interval", "5"], ["powerbudgetd status: error:", "--interval", "--watch"]),
    (["simulate", "--duration", "0"], ["powerbudgetd simulate: error: argument --duration"]),
    (["circuit", "join", "--backend", "gpu"], ["powerbudgetd circuit join: error: argument --backend: invalid choice"]),
    (["log", "report", "--last", "5"], ["powerbudgetd log report: error: argument --last"]),
], ids=["unknown", "no-command", "status", "simulate", "circuit-join", "log-report"])
def test_a_usage_error_is_one_line(args: list[str], words: list[str]) -> None:
    p = cli(*args, timeout=60)
    no_traceback(p)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert len(p.stderr.splitlines()) == 1, p.stderr
    for w in words:
        assert w in p.stderr, (w, p.stderr)


def test_help_still_prints_the_whole_usage() -> None:
    p = cli("status", "--help", timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("usage: powerbudgetd status") and "--watch" in p.stdout
