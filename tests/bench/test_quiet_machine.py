"""``wait_until_quiet``: scenarios of ``bench serve`` start once the machine is quiet."""
import multiprocessing
import sys
import time

import pytest

from paged_core.bench.quiet_machine import cpu_times, wait_until_quiet


class FakeMachine:
    """/proc/stat's (busy, total) ticks of 2 cores, 100 ticks a second each, busy at the
    given fractions in consecutive windows; a clock that moves only when slept."""

    def __init__(self, busy_per_window: list[float]) -> None:
        self.windows = list(busy_per_window)
        self.now = 0.0
        self.busy = self.total = 0

    def sample(self) -> tuple[int, int]:
        return self.busy, self.total

    def sleep(self, seconds: float) -> None:
        fraction = self.windows.pop(0)
        ticks = int(200 * seconds)
        self.busy += int(ticks * fraction)
        self.total += ticks
        self.now += seconds

    def clock(self) -> float:
        return self.now


def test_waits_through_busy_windows_and_reports_the_quiet_one():
    machine = FakeMachine([0.9, 0.6, 0.05, 0.9])
    quiet = wait_until_quiet(max_busy=0.1, window_s=1.0, timeout_s=60, sample=machine.sample,
                             sleep=machine.sleep, clock=machine.clock)
    assert quiet.quiet and quiet.busy == 0.05 and quiet.waited_s == 3.0
    assert machine.windows == [0.9]  # stopped at the first quiet window


def test_gives_up_after_the_timeout_and_says_it_was_busy():
    machine = FakeMachine([1.0] * 10)
    quiet = wait_until_quiet(max_busy=0.1, window_s=1.0, timeout_s=4, sample=machine.sample,
                             sleep=machine.sleep, clock=machine.clock)
    assert not quiet.quiet and quiet.busy == 1.0 and quiet.waited_s == 4.0


def test_unreadable_cpu_times_return_at_once():
    slept = []
    quiet = wait_until_quiet(sample=lambda: None, sleep=slept.append)
    assert quiet.busy is None and not quiet.quiet and slept == []


def test_cpu_times_parses_the_cpu_line(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 5 50 800 20 3 2 10 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    assert cpu_times(str(stat)) == (170, 990)
    stat.write_text("intr 1 2 3\n")
    assert cpu_times(str(stat)) is None
    assert cpu_times(str(tmp_path / "missing")) is None


def _spin(seconds: float, spinning) -> None:
    spinning.set()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.extended
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_a_busy_process_is_seen_on_this_machine():
    """A process spinning on a core makes a window at least 1/cores busy (real /proc/stat)."""
    cores = multiprocessing.cpu_count()
    context = multiprocessing.get_context("spawn")
    spinning = context.Event()
    spinner = context.Process(target=_spin, args=(3.0, spinning))
    spinner.start()
    try:
        assert spinning.wait(timeout=60), "the spinning process did not start"
        quiet = wait_until_quiet(max_busy=0.5 / cores, window_s=0.5, timeout_s=0)
    finally:
        spinner.join()
    assert quiet.busy is not None and quiet.busy >= 0.5 / cores and not quiet.quiet
