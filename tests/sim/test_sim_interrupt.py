"""Ctrl-C during a simulated NVML call: never a KeyboardInterrupt inside the ctypes
callback (ctypes would print "Exception ignored" and the caller go on or crash), but at
the simulation's next check, wherever in the callback the signal is handled (its first
line included: a CI failure, SIGSEGV)."""

from __future__ import annotations

import signal
import sys

import pytest

from powerbudgetd.hw.nvml import Nvml
from powerbudgetd_sim import libnvml
from powerbudgetd_sim.physics import SimBank
from powerbudgetd_sim.scenario import load_scenario


def test_a_sigint_inside_a_simulated_nvml_call_waits_for_the_next_check() -> None:
    lib = libnvml.SimNvmlLibrary(SimBank(list(load_scenario("one-busy").cards), seed=1))
    nvml = Nvml(lib)
    nvml.init()
    serve = lib.serve
    frames: list[str] = []

    def interrupted(symbol: str, args: tuple) -> int:
        # As the handler would be called, with the frame it interrupted: the callback's
        # own (its first line) and one below it.
        for frame in (sys._getframe(2), sys._getframe()):
            frames.append(frame.f_code.co_name)
            libnvml.on_sigint(signal.SIGINT, frame)
        return serve(symbol, args)

    lib.serve = interrupted  # type: ignore[method-assign]
    assert nvml.device_count() == 4  # the call completed: nothing raised inside it
    assert frames[:2] == ["routed", "interrupted"]
    with pytest.raises(KeyboardInterrupt):
        libnvml.check_interrupt()
    libnvml.check_interrupt()  # once only
    with pytest.raises(KeyboardInterrupt):  # outside any call: at once
        libnvml.on_sigint(signal.SIGINT, sys._getframe())


def test_a_sigint_at_the_callbacks_first_line_waits_too() -> None:
    """A profile hook runs at a call before its first line, where a signal handler can
    run too: the handler is called there with the callback's frame."""
    lib = libnvml.SimNvmlLibrary(SimBank(list(load_scenario("one-busy").cards), seed=1))
    nvml = Nvml(lib)
    nvml.init()
    calls = []

    def hook(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call" and frame.f_code.co_name == "routed":
            calls.append(frame.f_code.co_name)
            libnvml.on_sigint(signal.SIGINT, frame)

    sys.setprofile(hook)
    try:
        count = nvml.device_count()
    finally:
        sys.setprofile(None)
    assert calls and count == 4
    with pytest.raises(KeyboardInterrupt):
        libnvml.check_interrupt()
