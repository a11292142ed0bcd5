"""AdaptiveThreads sizes a CPU engine's OpenMP team to the cores other processes leave it:
the rules on scripted signals, the /proc readers on this machine, and a real engine beside
busy processes (its team shrinks, its greedy tokens stay those of a fixed team)."""
import asyncio
import contextlib
import os
import time

import pytest
import torch

from paged_core import LLM, AsyncEngine, SamplingParams
from paged_core.bench.busy_cores import busy_cores
from paged_core.cpu.adaptive_threads import (FIRST_HOLD_S, SETTING, WINDOW_S, AdaptiveThreads,
                                             Signals, adaptive_threads_enabled)
from paged_core.cpu.proc_ticks import process_ticks, threads_run_delay_s
from ..reference import assert_greedy_close

TICKS_PER_CORE_WINDOW = 50  # /proc/stat ticks (100 a second) of one core over WINDOW_S


class Script:
    """Signals advanced by hand: ``window(waiting=, foreign=)`` moves the clock one window on,
    with this process's threads waiting ``waiting`` threads' worth and other processes
    keeping ``foreign`` of the 2 cores busy."""

    def __init__(self) -> None:
        self.now = 0.0
        self.delay, self.busy, self.total, self.own = 0.0, 0, 0, 0

    def clock(self) -> float:
        return self.now

    def read(self) -> Signals:
        return Signals(self.delay, (self.busy, self.total), self.own)

    def window(self, waiting: float = 0.0, foreign: float = 0.0, own: float = 1.0) -> None:
        self.now += WINDOW_S
        self.delay += waiting * WINDOW_S
        self.total += 2 * TICKS_PER_CORE_WINDOW
        self.own += round(own * TICKS_PER_CORE_WINDOW)
        self.busy += round((own + foreign) * TICKS_PER_CORE_WINDOW)


@contextlib.contextmanager
def torch_threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def script():
    return Script()


def _threads(script: Script) -> AdaptiveThreads:
    return AdaptiveThreads(cores=2, read=script.read, clock=script.clock)


def test_a_team_that_waits_for_cores_gives_one_thread_up_per_window(script):
    threads = _threads(script)
    script.window(waiting=0.1)
    threads.update(ceiling=4)
    assert threads.team(4) == 4  # waiting under SHRINK_WAITING: nothing changes
    script.window(waiting=0.9)
    threads.update(ceiling=4)
    assert threads.team(4) == 3
    script.now += WINDOW_S / 2  # half a window later: no new look
    script.delay += 1.0
    threads.update(ceiling=4)
    assert threads.team(4) == 3
    for _ in range(5):
        script.window(waiting=0.9, foreign=1.0)
        threads.update(ceiling=4)
    assert threads.team(4) == 1  # never below one thread


def test_the_thread_comes_back_once_the_others_leave_room(script):
    threads = _threads(script)
    script.window(waiting=0.8, foreign=0.6)
    threads.update(ceiling=2)
    assert threads.team(2) == 1
    script.window(foreign=1.0)  # a team of one no longer waits: the busy cores say why
    threads.update(ceiling=2)
    assert threads.team(2) == 1
    script.window(foreign=0.5)  # 1.5 cores free: not room for a second thread and a margin
    threads.update(ceiling=2)
    assert threads.team(2) == 1
    script.window(foreign=0.1)
    threads.update(ceiling=2)
    assert threads.team(2) == 2


def test_an_idle_team_gives_a_thread_up_to_the_cores_the_others_keep_busy(script):
    """With nothing to run nothing waits: an idle window goes by the busy cores instead."""
    threads = _threads(script)
    script.window(own=0.0, foreign=0.5)  # 1.5 cores free: the team lacks 0.5, under 0.7
    threads.update(ceiling=2)
    assert threads.team(2) == 2
    script.window(own=0.05, foreign=1.0)  # one core free: the team lacks a whole one
    threads.update(ceiling=2)
    assert threads.team(2) == 1
    script.window(own=0.0, foreign=1.0)  # still busy: no room to grow back
    threads.update(ceiling=2)
    assert threads.team(2) == 1
    script.window(own=0.0, foreign=0.1)
    threads.update(ceiling=2)
    assert threads.team(2) == 2
    script.window(own=1.0, foreign=1.0)  # busy, not waiting (the others' core is their own)
    threads.update(ceiling=2)
    assert threads.team(2) == 2


def test_a_wait_with_the_others_idle_keeps_the_team(script):
    """This process's own threads (a server's HTTP front end) waiting beside the team: a
    smaller team would not cure that, and the next look would take the thread back."""
    threads = _threads(script)
    for _ in range(4):
        script.window(waiting=1.1, foreign=0.25)
        threads.update(ceiling=2)
        assert threads.team(2) == 2
    script.window(waiting=0.9, foreign=0.4)  # another process's load leaves 1.6 cores
    threads.update(ceiling=2)
    assert threads.team(2) == 1


def test_a_shrink_the_next_look_undoes_holds_off_the_next_one_for_longer_each_time(script):
    """A moment's load of another process shrinks the team once, then ever more rarely."""
    threads = _threads(script)
    script.window(waiting=0.9, foreign=0.6)
    threads.update(ceiling=2)
    assert threads.team(2) == 1
    holds = []
    for _ in range(3):
        script.window(foreign=0.1)
        threads.update(ceiling=2)
        assert threads.team(2) == 2  # undone
        windows = 0
        while True:
            script.window(waiting=0.9, foreign=0.6)
            threads.update(ceiling=2)
            if threads.team(2) == 1:
                break
            windows += 1
        holds.append(windows * WINDOW_S)
    assert holds[0] >= FIRST_HOLD_S - WINDOW_S
    assert holds[1] >= 2 * holds[0] - WINDOW_S and holds[2] >= 2 * holds[1] - WINDOW_S


def test_a_shrink_that_holds_resets_the_hold(script):
    threads = _threads(script)
    script.window(waiting=0.9, foreign=0.6)
    threads.update(ceiling=2)
    script.window(foreign=0.1)
    threads.update(ceiling=2)  # undone: the next shrink waits FIRST_HOLD_S
    for _ in range(round(FIRST_HOLD_S / WINDOW_S)):
        script.window(foreign=0.1)
        threads.update(ceiling=2)
    script.window(waiting=0.9, foreign=0.9)
    threads.update(ceiling=2)
    assert threads.team(2) == 1
    script.window(foreign=1.0)  # a busy process took the core: the shrink holds
    threads.update(ceiling=2)
    assert threads.team(2) == 1 and threads.hold_s == FIRST_HOLD_S


def test_unreadable_signals_change_nothing():
    threads = AdaptiveThreads(cores=2, read=lambda: Signals(None, None, None),
                              clock=iter(range(0, 100, 1)).__next__)
    for _ in range(5):
        threads.update(ceiling=2)
    assert threads.team(2) == 2


def test_a_lower_ceiling_set_later_is_honoured(script):
    threads = _threads(script)
    script.window(waiting=0.9)
    threads.update(ceiling=4)
    assert threads.team(4) == 3
    assert threads.team(2) == 1


def test_the_team_applies_inside_a_step_only(script):
    with torch_threads(2):
        threads = _threads(script)
        script.window(waiting=0.9, foreign=1.0)
        seen = []
        with threads.sized_team() as team:
            seen.append((team, torch.get_num_threads()))
        assert seen == [(1, 1)]
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError, match="step failed"):
            with threads.sized_team():
                raise RuntimeError("step failed")
        assert torch.get_num_threads() == 2  # restored after a failing step too


def test_the_setting(monkeypatch):
    monkeypatch.delenv(SETTING, raising=False)
    assert adaptive_threads_enabled()
    for value, enabled in (("1", True), ("on", True), ("0", False), ("off", False)):
        monkeypatch.setenv(SETTING, value)
        assert adaptive_threads_enabled() is enabled
    monkeypatch.setenv(SETTING, "sometimes")
    with pytest.raises(ValueError, match=SETTING):
        adaptive_threads_enabled()


def test_this_process_ticks_and_run_delay_are_read_here():
    if threads_run_delay_s() is None:
        pytest.skip("no /proc/self/task/*/schedstat here (not Linux, or no schedstats)")
    ticks = process_ticks()
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    assert process_ticks() >= ticks + 20  # 0.3 s of CPU at 100 ticks a second, less rounding
    cores = os.cpu_count() or 1
    with busy_cores(cores):
        time.sleep(0.3)
        delay = threads_run_delay_s()
        stop = time.monotonic() + 1.5
        with torch_threads(cores):
            block = torch.ones(1 << 22)
            while time.monotonic() < stop:
                block.mul_(1.0)  # parallel ops of this process's OpenMP team
        # a team of `cores` threads beside `cores` busy processes: they wait about half the time
        assert threads_run_delay_s() - delay > 0.3


def _greedy(llm: LLM) -> list[tuple[list[int], list[set[int]]]]:
    """Greedy tokens of two prompts, each with its steps' top-5 token sets."""
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True, logprobs=5)
    prompts = ["The capital of France is", "Once upon a time, in a quiet village,"]
    return [(out.outputs[0].token_ids, [set(step) for step in out.outputs[0].logprobs])
            for out in llm.generate(prompts, params, use_tqdm=False)]


def test_an_engine_beside_busy_processes_shrinks_its_team_and_keeps_its_output(monkeypatch):
    """(With a latency target, whose pacer then learns the smaller team's costs.)"""
    cores = os.cpu_count() or 1
    if cores < 2 or threads_run_delay_s() is None:
        pytest.skip("needs 2+ cores and /proc schedstats: nothing to shrink or no signal")
    with torch_threads(2):
        monkeypatch.setenv(SETTING, "0")
        fixed = LLM(dtype="float32", num_kv_blocks=64)
        assert fixed.engine.core.executor.threads is None
        expected = _greedy(fixed)
        monkeypatch.delenv(SETTING)
        llm = LLM(dtype="float32", num_kv_blocks=64, itl_target_ms=150)
        threads = llm.engine.core.executor.threads
        assert isinstance(threads, AdaptiveThreads)
        with busy_cores(cores):
            tokens = _greedy(llm)
            deadline = time.monotonic() + 60
            while threads.given_up == 0 and time.monotonic() < deadline:
                tokens = _greedy(llm)
        assert threads.given_up >= 1  # the team left a core to the busy processes
        core = llm.engine.core  # its latency target budgets with the smaller team's costs
        assert core.pacer.team == core.executor.last_team == 2 - threads.given_up
        for (ours, our_tops), (theirs, their_tops) in zip(tokens, expected):
            assert_greedy_close(ours, our_tops, theirs, their_tops)  # the same computation
        assert torch.get_num_threads() == 2  # the caller's count outside the steps


def test_a_step_is_budgeted_for_the_team_that_runs_it(script):
    """The look before a step gives a thread up: the latency target sizes that very step with
    the smaller team's cost (scripted signals, as below)."""
    with torch_threads(2):
        llm = LLM(dtype="float32", num_kv_blocks=64, itl_target_ms=150)
        core = llm.engine.core
        core.executor.threads = _threads(script)
        budget, teams = core.pacer.budget, []
        core.pacer.budget = lambda num_decodes, team: teams.append(team) or budget(num_decodes,
                                                                                   team)
        script.window(waiting=0.9, foreign=1.0)
        llm.generate(["The capital of France is"], SamplingParams(max_tokens=2), use_tqdm=False)
        assert teams[0] == 1 and core.executor.last_team == 1


def test_an_idle_server_engine_sizes_its_team_before_its_next_request(script):
    """The server loop's idle wake-ups look at the machine (here scripted signals: the tests
    beside this one load the real machine), with no step run."""
    with torch_threads(2):
        engine = AsyncEngine(dtype="float32", num_kv_blocks=64)
        try:
            executor = engine.engine.core.executor
            executor.threads = _threads(script)
            script.window(own=0.0, foreign=1.0)  # idle beside a busy core
            deadline = time.monotonic() + 5
            while executor.threads.given_up == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert executor.threads.given_up == 1
            assert not engine.engine.has_unfinished_requests()
        finally:
            asyncio.run(engine.shutdown())


def test_batch_invariant_mode_keeps_the_callers_team():
    llm = LLM(dtype="float32", num_kv_blocks=64, batch_invariant=True)
    assert llm.engine.core.executor.threads is None


def test_a_bad_setting_stops_the_engine_with_its_name(monkeypatch):
    monkeypatch.setenv(SETTING, "maybe")
    with pytest.raises(ValueError, match=SETTING):
        LLM(dtype="float32", num_kv_blocks=64)
