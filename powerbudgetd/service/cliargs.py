"""Argument checks for the command line, done by argparse before any work starts.

Each check turns a bad value into argparse's usage error (exit 2, one line naming the
option and the value), so a mistake costs the operator a second, not a traceback after
a minute of simulation.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

PLOT_SUFFIXES = (".png", ".svg", ".pdf")
# Where a command finds its cards (service/backend.py builds them; named here, where the
# parser can import them without loading the simulator).
BACKENDS = ("nvml", "sim", "hwmon", "amdsmi", "auto")
CONFIG_HELP = "config file (default: $POWERBUDGETD_CONFIG or /etc/powerbudgetd/powerbudgetd.toml)"


def add_card_options(parser: argparse.ArgumentParser) -> None:
    """``--config`` and ``--backend`` for a command that writes this host's cards
    (``failsafe``, ``restore``)."""
    parser.add_argument("--config", type=Path, default=None, help=CONFIG_HELP)
    parser.add_argument("--backend", choices=BACKENDS, default="nvml",
                        help="nvml: this host's NVIDIA GPUs; hwmon: its AMD / Intel cards (kernel hwmon files); "
                        "amdsmi: its AMD cards through ROCm's AMD SMI; auto: every one of those that has a card "
                        "(AMD SMI before hwmon where it imports); sim: the config's [sim] bank (its state_file)")


class OneLineParser(argparse.ArgumentParser):
    """argparse with usage errors in one line on stderr, ``PROG: error: MESSAGE (see
    PROG --help)``, and exit 2; ``--help`` still prints the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_float(what: str, *, lower: float | None = None, upper: float | None = None) -> Callable[[str], float]:
    """An argparse ``type``: a finite number > 0 (and >= ``lower``, <= ``upper``); ``what``
    names the unit."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r} (give {what})") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"must be a positive number of {what}, got {text!r}")
        if lower is not None and value < lower:
            raise argparse.ArgumentTypeError(f"must be at least {lower:g} {what}, got {text!r}")
        if upper is not None and value > upper:
            raise argparse.ArgumentTypeError(f"must be at most {upper:g} {what}, got {text!r}")
        return value

    return parse


def duration(text: str) -> float:
    """An argparse ``type``: ``90s``, ``10m``, ``2h``, ``1d`` to seconds (> 0). The unit is
    required: a bare ``10`` could mean seconds or minutes, and a wrong guess reads the
    wrong window of a power log."""
    from powerbudgetd.powerlog.report import parse_duration

    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"must be a positive duration, got {text!r} (like 90s, 10m, 2h, 1d)")
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if text.strip()[-1].isdigit():
        raise argparse.ArgumentTypeError(f"give a unit: {text}s, {text}m, {text}h or {text}d, got {text!r}")
    return seconds


def metrics_url(text: str) -> str:
    """An argparse ``type``: an ``http://HOST[:PORT]/PATH`` URL ``status`` can read."""
    from powerbudgetd.service.scrape import ScrapeError, Target

    try:
        Target.parse(text)
    except ScrapeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def writable_plot(text: str) -> str:
    """An argparse ``type``: a plot file we will be able to write, checked before the work
    that fills it (its directory exists and is writable, a known image suffix, and
    matplotlib is installed)."""
    path = Path(text)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise argparse.ArgumentTypeError(f"{text}: give a file ending in {', '.join(PLOT_SUFFIXES)}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such directory: {parent}")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a directory")
    # Write for real: permission bits do not tell about /proc, /sys, a read-only mount
    # or a full disk. A file that was not there before is removed again.
    existed = path.exists()
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: cannot write it: {exc.strerror or exc}") from None
    if not existed:
        try:
            path.unlink()
        except OSError:
            pass
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise argparse.ArgumentTypeError("plotting needs matplotlib: pip install 'powerbudgetd[plot]'") from None
    return text


def refuse_conflicts(
    parser: argparse.ArgumentParser, args: argparse.Namespace, rules: Sequence[tuple[str, Sequence[str], str]]
) -> None:
    """Exit through ``parser.error`` (status 2) when options that cannot go together were
    given. ``rules``: (option, the options it excludes, why); an option counts as given
    when its value is neither None nor False."""

    def given(opt: str) -> bool:
        value = getattr(args, opt.lstrip("-").replace("-", "_"))
        return value is not None and value is not False

    for opt, others, why in rules:
        if not given(opt):
            continue
        clash = [o for o in others if given(o)]
        if clash:
            parser.error(f"{opt} cannot be combined with {', '.join(clash)}: {why}")


def require(
    parser: argparse.ArgumentParser, args: argparse.Namespace, rules: Sequence[tuple[str, str, Callable[[argparse.Namespace], bool]]]
) -> None:
    """Exit through ``parser.error`` when an option was given without what it needs.
    ``rules``: (option, what it needs in words, a test of the parsed arguments)."""
    for opt, needs, ok in rules:
        value = getattr(args, opt.lstrip("-").replace("-", "_"))
        if value is not None and value is not False and not ok(args):
            parser.error(f"{opt} needs {needs}")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Adds ``(default: X)`` to an option's help where it has a default worth stating
    and the help does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" not in text
            and default not in (None, False, argparse.SUPPRESS)
            and action.option_strings
            and action.nargs != 0
        ):
            text += " (default: %(default)s)"
        return text
