"""``powerbudgetd restore``: every card back to the power limit the daemon found on it.

Reads the record the daemon kept at its first start (:mod:`~powerbudgetd.service.originals`)
and writes each recorded card's limit back, by UUID: decreases first, each read back in
force before any increase is sent, then the increases one at a time, each read back.
When the recorded limits (with every card not in the record at its bound) sum above the
budget boot and failsafe hold the bank to, it says by how much and writes nothing
unless given ``--force``: the operator's own limits were over the budget. Not while the
daemon runs (its instance lock): it would take the cards straight back.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from powerbudgetd.errors import AlreadyRunning, ConfigError, ExitStatus, NvmlError
from powerbudgetd.service.cliargs import add_card_options
from powerbudgetd.core.units import to_w

CALL_TIMEOUT_S = 2.0  # one NVML call
CONFIRM_TIMEOUT_S = 5.0  # one write's read-back (a healthy card takes well under a second)

if TYPE_CHECKING:
    from powerbudgetd.config import Settings
    from powerbudgetd.hw.calls import InlineCalls
    from powerbudgetd.hw.card import CardBackend as Nvml  # any backend: the name its callers know
    from powerbudgetd.service.originals import Original


def add_parser(sub: argparse._SubParsersAction, formatter_class: type[argparse.HelpFormatter]) -> None:
    """The ``restore`` command's arguments (cli.py's parser calls this)."""
    p = sub.add_parser(
        "restore", help="put back the power limits found before the daemon first ran", formatter_class=formatter_class,
        description="Write back each card's power limit as the daemon found it at its first start on this host "
        "(original-limits.json beside the flight recorder): decreases first, read back, then increases. "
        "Refuses, writing nothing, when the recorded limits sum over the budget, unless --force. Not while "
        "the daemon runs: stop it first (uninstall).",
    )
    add_card_options(p)
    p.add_argument("--file", type=Path, default=None,
                   help="the record to restore (default: original-limits.json in the config's [recorder] dir)")
    p.add_argument("--force", action="store_true",
                   help="restore even when the recorded limits sum over the budget")


@dataclass(frozen=True)
class _Step:
    index: int
    uuid: str
    from_mw: int  # the card's bound now: the higher of requested and enforced
    to_mw: int


def command(args: argparse.Namespace) -> int:
    """Run ``restore``; its exit status (0: every recorded card present is back)."""
    from powerbudgetd.config import default_config_path, load_config
    from powerbudgetd.service.instance import InstanceLock, lock_path
    from powerbudgetd.service.logs import configure_logging
    from powerbudgetd.service.originals import OriginalsError, load, originals_path

    try:
        settings = load_config(args.config or default_config_path())
    except ConfigError as exc:
        print(f"powerbudgetd: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    configure_logging(level="warning", stream=sys.stderr)
    path = args.file or originals_path(settings, args.backend)
    try:
        originals = load(path)
    except OriginalsError as exc:
        print(f"powerbudgetd: restore: {exc}", file=sys.stderr)
        return ExitStatus.CONFIG
    lock = None
    if (lpath := lock_path(args.backend, False, settings.sim.state_file)) is not None:
        try:
            lock = InstanceLock(lpath).acquire()
        except AlreadyRunning as exc:
            print(f"powerbudgetd: restore: the daemon is running ({exc}); stop it first, or it takes the cards "
                  "back to its shares", file=sys.stderr)
            return ExitStatus.ALREADY_RUNNING
        except OSError:
            lock = None  # no runtime directory: no daemon took it either
    try:
        return _restore(args, settings, originals, path)
    finally:
        if lock is not None:
            lock.release()


def _restore(args: argparse.Namespace, settings: Settings, originals: dict[str, Original], path: Path) -> int:
    from powerbudgetd.control.actuator import Actuator
    from powerbudgetd.core.plan import Write
    from powerbudgetd.core.units import to_mw
    from powerbudgetd.hw.calls import DeadlineCalls
    from powerbudgetd.hw.nvml import GpuInfo, PowerReading
    from powerbudgetd.hw.nvmlscope import NvmlScope
    from powerbudgetd.service.backend import make_nvml
    from powerbudgetd.service.feasibility import reserve_figure

    calls = DeadlineCalls(CALL_TIMEOUT_S)
    scope: NvmlScope | None = None
    try:
        nvml = make_nvml(args.backend, settings.sim.scenario, settings.sim.seed, settings.sim.lag_s,
                         settings.sim.state_file)
        scope = NvmlScope(nvml, init_timeout_s=5.0)
        scope.open()
        count = calls.call("bank", nvml.device_count)
    except NvmlError as exc:
        if scope is not None:
            scope.close()
        print(f"powerbudgetd: restore: NVML unavailable: {exc}; no limit written", file=sys.stderr)
        return ExitStatus.NVML
    try:
        found = calls.many({f"index {i}": (nvml.device, (i,)) for i in range(count)})
        infos = [v for v in found.values() if isinstance(v, GpuInfo)]
        unreachable = [f"GPU {i} ({found[f'index {i}']})" for i in range(count) if not isinstance(found[f"index {i}"], GpuInfo)]
        if unreachable:
            print(f"powerbudgetd: restore: {', '.join(unreachable)} cannot be read: its limit is unknown, so the "
                  "sum cannot be checked; no limit written", file=sys.stderr)
            return ExitStatus.ERROR
        reads = calls.many({i.uuid: (nvml.read, (i.uuid,)) for i in infos})
        steps: list[_Step] = []
        kept_mw, problems = 0, []
        for info in infos:
            r = reads[info.uuid]
            if not isinstance(r, PowerReading) or r.requested_limit_w is None:
                problems.append(f"GPU {info.index} {info.uuid}: cannot be read ({r})")
                continue
            bound_mw = to_mw(max(v for v in (r.requested_limit_w, r.enforced_limit_w) if v is not None))
            orig = originals.get(info.uuid)
            if orig is None:
                kept_mw += bound_mw  # not in the record: left as it is, counted at its bound
                print(f"GPU {info.index} {info.uuid}: not in the record, left at {to_w(bound_mw):g} W")
                continue
            lo, hi = info.min_limit_w, info.max_limit_w
            if lo is not None and hi is not None and not lo <= orig.limit_w <= hi:
                problems.append(f"GPU {info.index} {info.uuid}: recorded {orig.limit_w:g} W is outside its "
                                f"constraints now ({lo:g}-{hi:g} W)")
                kept_mw += bound_mw
                continue
            steps.append(_Step(info.index, info.uuid, bound_mw, to_mw(orig.limit_w)))
        for uuid in sorted(set(originals) - {i.uuid for i in infos}):
            print(f"{uuid}: recorded ({originals[uuid].limit_w:g} W) but not on this host now: skipped")
        if problems:
            for p in problems:
                print(f"powerbudgetd: restore: {p}", file=sys.stderr)
            print("powerbudgetd: restore: no limit written", file=sys.stderr)
            return ExitStatus.ERROR
        budget_w = reserve_figure(settings, [i.name for i in infos]).budget_w
        total_mw = kept_mw + sum(s.to_mw for s in steps)
        if total_mw > to_mw(budget_w):
            over = f"the recorded limits sum to {to_w(total_mw):g} W, {to_w(total_mw) - budget_w:g} W over the budget of {budget_w:g} W"
            if not args.force:
                print(f"powerbudgetd: restore: {over}; no limit written. Give --force to restore them anyway "
                      "(the bank may then draw more than the budget)", file=sys.stderr)
                return ExitStatus.ERROR
            print(f"warning: {over}; restoring them (--force)", file=sys.stderr)
        actuator = Actuator(nvml, calls=calls)
        sum_mw = kept_mw + sum(s.from_mw for s in steps)
        allowed_mw = max(to_mw(budget_w), total_mw)  # --force: the operator's own sum
        failed = 0
        # Decreases first, all read back, before any increase spends what they free.
        for batch in ([s for s in steps if s.to_mw < s.from_mw], [s for s in steps if s.to_mw >= s.from_mw]):
            for s in batch:
                applied = actuator.apply([Write(s.uuid, s.from_mw, s.to_mw)], sum_bound_mw=sum_mw, budget_mw=allowed_mw)[0]
                ok = applied.done and _read_back(nvml, calls, s.uuid, s.to_mw)
                if ok:
                    sum_mw += s.to_mw - s.from_mw
                else:
                    failed += 1
                why = "" if ok else f" FAILED ({applied.error or 'not read back in force in time'})"
                print(f"GPU {s.index} {s.uuid}: {to_w(s.from_mw):g} W -> {to_w(s.to_mw):g} W{why}")
            if failed:
                break  # an increase after a failed decrease could pass the budget
        if failed:
            print(f"powerbudgetd: restore: {failed} card(s) not restored; run it again", file=sys.stderr)
            return ExitStatus.ERROR
        print(f"restored {len(steps)} card(s) from {path}: sum of limits {to_w(sum_mw):g} W")
        return ExitStatus.OK
    finally:
        scope.close()  # within its deadline: with a call abandoned on a hung card it may never return


def _read_back(nvml: Nvml, calls: InlineCalls, uuid: str, to_mw: int) -> bool:
    """Whether the card's requested limit reads ``to_mw`` within CONFIRM_TIMEOUT_S, and
    its enforced limit is not above it (another limiter may hold it lower)."""
    from powerbudgetd.core.units import opt_mw

    end = time.monotonic() + CONFIRM_TIMEOUT_S
    while True:
        try:
            r = calls.call(uuid, nvml.read, uuid)
        except NvmlError:
            r = None
        if r is not None:
            req, enf = opt_mw(r.requested_limit_w), opt_mw(r.enforced_limit_w)
            if req == to_mw and (enf is None or enf <= to_mw):
                return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)
