"""NVML calls run on a small pool of long-lived workers: no thread per call, one worker
for a batch of quick calls, and a hung card holds up one worker only."""

from __future__ import annotations

import threading
import time

import pytest

from powerbudgetd.errors import NvmlTimeout
from powerbudgetd.hw import calls as calls_module
from powerbudgetd.hw.calls import DeadlineCalls
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd_sim.libnvml import SimNvmlLibrary
from powerbudgetd_sim.physics import CardSpec, SimBank


def sim_nvml(cards: int) -> tuple[Nvml, list[str]]:
    bank = SimBank([CardSpec(f"GPU-w-{i}", "worker test card", 150.0, 300.0, 300.0, 30.0) for i in range(cards)],
                   seed=1)
    nvml = Nvml(SimNvmlLibrary(bank))
    nvml.init()
    return nvml, [i.uuid for i in nvml.devices()]


@pytest.fixture
def started_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads started from now on (threading.Thread.start counted)."""
    names: list[str] = []
    start = threading.Thread.start

    def counting(self: threading.Thread) -> None:
        names.append(self.name)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", counting)
    return names


def test_many_calls_on_four_cards_start_no_thread_per_call(started_threads: list[str]) -> None:
    nvml, uuids = sim_nvml(4)
    calls = DeadlineCalls(2.0)
    for _ in range(100):  # 100 ticks: each card read at once, then an energy read and a write each
        reads = calls.many({u: (nvml.read, (u,)) for u in uuids})
        assert all(r.requested_limit_w in (300.0, 250.0) for r in reads.values())
        for u in uuids:
            calls.call(u, nvml.energy_j, u)
            calls.call(u, nvml.set_power_limit, u, 250.0)
        calls.call("bank", nvml.device_count)
    # One worker serves them all; another only where a batch stalled for SPREAD_S (a
    # busy machine's preemption), never one a call or one a card.
    assert 1 <= len(started_threads) <= 3, started_threads
    assert calls.workers() == len(started_threads)


def test_a_batch_of_quick_calls_runs_on_one_worker() -> None:
    """Waking a thread costs more than a quick call: the batch is not spread over them."""
    ran: list[str] = []

    def quick(i: int) -> int:
        ran.append(threading.current_thread().name)
        return i

    calls = DeadlineCalls(2.0)
    for _ in range(50):
        assert calls.many({f"card {i}": (quick, (i,)) for i in range(8)}) == {f"card {i}": i for i in range(8)}
    # Another only where a busy machine stalled a batch for 2 ms; one a card would be eight.
    assert len(ran) == 400 and len(set(ran)) <= 4, set(ran)


def test_many_calls_of_python_time_stay_on_one_worker() -> None:
    """256 calls of 0.1 ms of Python each (as the simulator's): more threads would only
    share the GIL, so the batch is not spread however long it is."""
    ran: list[str] = []

    def python_time() -> None:
        end = time.perf_counter() + 0.0001
        while time.perf_counter() < end:
            pass
        ran.append(threading.current_thread().name)

    calls = DeadlineCalls(5.0)
    for _ in range(3):
        calls.many({f"card {i}": (python_time, ()) for i in range(256)})
    assert len(ran) == 768 and len(set(ran)) <= 6, set(ran)  # sized by a mean of call times: 13


def test_a_worker_slow_to_start_gets_no_company_until_it_runs(monkeypatch: pytest.MonkeyPatch,
                                                              started_threads: list[str]) -> None:
    """On a loaded machine a new thread may take longer than SPREAD_S to run: the batch
    waits for it rather than handing out a worker every SPREAD_S meanwhile."""
    serve = calls_module._Worker._serve

    def late(self: calls_module._Worker) -> None:
        time.sleep(0.03)
        serve(self)

    monkeypatch.setattr(calls_module._Worker, "_serve", late)
    calls = DeadlineCalls(2.0)
    assert calls.call("card", int, 7) == 7
    assert calls.many({f"card {i}": (int, (i,)) for i in range(8)}) == {f"card {i}": i for i in range(8)}
    assert started_threads == ["nvml-worker-1"]


def test_a_bank_on_a_slow_driver_is_read_side_by_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls about as slow as an H200's GetFieldValues (~3 ms; 5 ms here): once a batch
    has shown it (its fastest call took that long), the next is handed to one worker a
    call at once, not one more each stall (that would keep about three at once: each
    return is progress)."""
    handed: list[int] = []
    hand, wait = DeadlineCalls._hand, DeadlineCalls._wait

    def counting_hand(self: DeadlineCalls, batch: object) -> object:
        handed[-1] += 1
        return hand(self, batch)  # type: ignore[arg-type]

    def counting_wait(self: DeadlineCalls, *args: object) -> object:
        handed.append(handed.pop())  # the count at the wait's start is the batch's first hand-out
        handed.append(0)  # hands while waiting (stalls) go to a fresh count
        return wait(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(DeadlineCalls, "_hand", counting_hand)
    monkeypatch.setattr(DeadlineCalls, "_wait", counting_wait)

    def slow() -> int:
        time.sleep(0.005)
        return 1

    calls = DeadlineCalls(5.0)
    for _ in range(2):
        handed.append(0)
        assert set(calls.many({f"card {i}": (slow, ()) for i in range(8)}).values()) == {1}
    first_out, second_out = handed[0], handed[2]  # handed[1]: the first batch's stalls
    assert first_out == 1 and second_out == 8, handed  # quick until shown slow


def test_a_lagging_call_holds_the_rest_of_its_batch_for_spread_s_not_its_deadline() -> None:
    """The first call blocks until the batch's last one runs: on one worker in order that
    would never happen before the 5 s deadline; a worker joins once the batch stalls."""
    release = threading.Event()

    def lags() -> str:
        release.wait(10.0)
        return "late" if release.is_set() else "never released"

    def last() -> str:
        release.set()
        return "last"

    calls = DeadlineCalls(5.0)
    t0 = time.monotonic()
    out = calls.many({"slow": (lags, ()), **{f"card {i}": (int, (i,)) for i in range(6)}, "last": (last, ())})
    assert time.monotonic() - t0 < 1.0
    assert out == {"slow": "late", **{f"card {i}": i for i in range(6)}, "last": "last"}
    assert calls.overdue() == {}


def test_calls_on_one_key_never_run_side_by_side() -> None:
    """Another caller's call on a key whose call still runs is refused at once."""
    release, entered = threading.Event(), threading.Event()

    def holds() -> str:
        entered.set()
        release.wait(10.0)
        return "held"

    calls = DeadlineCalls(5.0)
    first: list[object] = []
    other = threading.Thread(target=lambda: first.append(calls.call("card", holds)))
    other.start()
    try:
        assert entered.wait(5.0)
        with pytest.raises(NvmlTimeout, match="has not returned for"):
            calls.call("card", lambda: "beside it")
        assert calls.call("another card", lambda: "answered") == "answered"
    finally:
        release.set()
        other.join(5.0)
    assert first == ["held"] and calls.call("card", lambda: "again") == "again"


def test_a_hung_card_does_not_delay_another_cards_calls() -> None:
    """Card 0's call blocks until released; meanwhile card 1's calls return at once, and
    further calls on card 0 fail at once rather than queue behind the hung one."""
    nvml, (hung_uuid, other_uuid) = sim_nvml(2)
    release, entered = threading.Event(), threading.Event()

    def hangs() -> str:
        entered.set()
        release.wait(30.0)
        return "late"

    calls = DeadlineCalls(0.05)
    try:
        with pytest.raises(NvmlTimeout, match="did not return in time"):
            calls.call(hung_uuid, hangs)
        assert entered.is_set() and hung_uuid in calls.overdue()
        # A generous deadline: were the other card's calls queued behind the hung one
        # (one shared worker) they would time out; they are answered, every one.
        for _ in range(50):
            out = calls.many({hung_uuid: (nvml.read, (hung_uuid,)), other_uuid: (nvml.read, (other_uuid,))})
            assert isinstance(out[hung_uuid], NvmlTimeout) and "has not returned for" in str(out[hung_uuid])
            assert out[other_uuid].enforced_limit_w == 300.0
            assert calls.call(other_uuid, nvml.energy_j, other_uuid, timeout_s=5.0) is not None
        assert not release.is_set()  # the hung call was still running throughout
    finally:
        release.set()


def test_the_hung_cards_worker_serves_it_again_once_its_call_returns(started_threads: list[str]) -> None:
    nvml, (uuid,) = sim_nvml(1)
    release = threading.Event()
    calls = DeadlineCalls(0.05)
    with pytest.raises(NvmlTimeout):
        calls.call(uuid, release.wait, 30.0)
    release.set()
    for _ in range(200):  # until the abandoned call has returned on its worker
        try:
            reading = calls.call(uuid, nvml.read, uuid, timeout_s=5.0)
            break
        except NvmlTimeout:
            threading.Event().wait(0.01)
    assert reading.enforced_limit_w == 300.0 and calls.overdue() == {}
    assert len(started_threads) == 1  # no replacement worker: the same one carried on


def test_an_idle_worker_ends_and_a_later_call_starts_it_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calls_module, "IDLE_EXIT_S", 0.05)
    calls = DeadlineCalls(2.0)
    assert calls.call("card", lambda: 1) == 1
    for _ in range(200):
        if calls.workers() == 0:
            break
        threading.Event().wait(0.01)
    assert calls.workers() == 0
    assert calls.call("card", lambda: 2) == 2 and calls.workers() == 1


def test_many_returns_once_every_call_is_back_not_at_its_deadline() -> None:
    """One wake-up for the batch: ``many`` returns when its last call is back, a card
    refused at once (its hung call still running) counting as back, and a call
    abandoned in an earlier batch returning late does not disturb a later one."""
    nvml, (hung_uuid, other_uuid) = sim_nvml(2)
    release = threading.Event()
    calls = DeadlineCalls(5.0)  # were a refused card not counted back, each batch would take 5 s
    try:
        with pytest.raises(NvmlTimeout):
            calls.call(hung_uuid, release.wait, 30.0, timeout_s=0.05)
        for _ in range(20):
            t0 = time.monotonic()
            out = calls.many({hung_uuid: (nvml.read, (hung_uuid,)), other_uuid: (nvml.read, (other_uuid,))})
            assert time.monotonic() - t0 < 1.0
            assert isinstance(out[hung_uuid], NvmlTimeout) and out[other_uuid].enforced_limit_w == 300.0
        assert calls.many({}) == {}
    finally:
        release.set()
    # The abandoned call returns on its worker and counts down its own (stale) gate;
    # the next batches on both cards are answered, each at once.
    for _ in range(200):
        if not calls.overdue():
            break
        threading.Event().wait(0.01)
    for _ in range(20):
        t0 = time.monotonic()
        out = calls.many({hung_uuid: (nvml.read, (hung_uuid,)), other_uuid: (nvml.read, (other_uuid,))})
        assert time.monotonic() - t0 < 1.0
        assert all(r.enforced_limit_w == 300.0 for r in out.values())


def test_a_batch_call_missing_the_deadline_is_abandoned_and_the_others_are_answered() -> None:
    nvml, (slow_uuid, other_uuid) = sim_nvml(2)
    release = threading.Event()
    calls = DeadlineCalls(0.1)
    try:
        out = calls.many({slow_uuid: (release.wait, (30.0,)), other_uuid: (nvml.read, (other_uuid,))})
        assert isinstance(out[slow_uuid], NvmlTimeout) and "did not return in time" in str(out[slow_uuid])
        assert out[other_uuid].enforced_limit_w == 300.0 and slow_uuid in calls.overdue()
    finally:
        release.set()


def test_a_returned_exception_is_a_value_and_no_time_left_starts_no_call(started_threads: list[str]) -> None:
    calls = DeadlineCalls(2.0)
    error = ValueError("a value")
    assert calls.call("card", lambda: error) is error
    assert calls.many({"card": (lambda: error, ())}) == {"card": error}
    with pytest.raises(ValueError, match="raised"):
        calls.call("card", lambda: (_ for _ in ()).throw(ValueError("raised")))
    ran: list[int] = []
    for _ in range(100):
        with pytest.raises(NvmlTimeout, match="no time left"):
            calls.call("card", ran.append, 1, timeout_s=0.0)
    assert ran == [] and len(started_threads) == 1
    assert calls.call("card", lambda: "unbounded", timeout_s=float("inf")) == "unbounded"


def test_a_hung_call_returning_late_does_not_spread_the_next_batches(started_threads: list[str]) -> None:
    """An abandoned call says nothing of how long calls take: quick batches after it stay
    on one worker (a mean of call times lifted by it handed out one thread a card)."""
    calls = DeadlineCalls(0.05)
    release = threading.Event()
    with pytest.raises(NvmlTimeout):
        calls.call("card 0", release.wait, 30.0)
    release.set()
    for _ in range(200):  # until the abandoned call has returned on its worker
        if not calls.overdue():
            break
        time.sleep(0.01)
    for _ in range(5):
        assert calls.many({f"card {i}": (int, (i,)) for i in range(8)}) == {f"card {i}": i for i in range(8)}
    assert len(started_threads) <= 2, started_threads  # the first, and one only if a batch stalled
