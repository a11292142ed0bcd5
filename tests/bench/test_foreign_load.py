"""``ForeignLoad``: how busy processes outside ``bench serve``'s own tree kept the machine
while a scenario ran (``paged_core.bench.foreign_load``)."""
import os
import subprocess
import sys
import time

import pytest

from paged_core.bench.foreign_load import ForeignLoad, process_tree_ticks

# /proc/<pid>/stat after the name: state ppid pgrp session tty tpgid flags minflt cminflt
# majflt cmajflt utime stime cutime cstime ...
_REST = "S {ppid} 1 1 0 -1 0 0 0 0 0 {utime} {stime} {cutime} {cstime} 20 0 1 0 100"


class FakeProc:
    """A /proc with a stat line per process and the machine's /proc/stat."""

    def __init__(self, root) -> None:
        self.root = root
        (root / "self").mkdir()  # not a process: skipped
        self.machine(0, 0)

    def process(self, pid: int, ppid: int, name: str, utime: int, stime: int = 0,
                cutime: int = 0, cstime: int = 0) -> None:
        folder = self.root / str(pid)
        folder.mkdir(exist_ok=True)
        rest = _REST.format(ppid=ppid, utime=utime, stime=stime, cutime=cutime, cstime=cstime)
        (folder / "stat").write_text(f"{pid} ({name}) {rest}\n")

    def machine(self, busy: int, total: int) -> None:
        # user nice system idle iowait irq softirq steal guest guest_nice
        (self.root / "stat").write_text(f"cpu  {busy} 0 0 {total - busy} 0 0 0 0 0 0\n")


@pytest.fixture
def proc(tmp_path):
    fake = FakeProc(tmp_path)
    fake.process(1, 0, "init", 1000)
    fake.process(100, 1, "bench", 10, 5, cutime=3)
    fake.process(101, 100, "server (api) x)", 40, 2)  # a name with spaces and parentheses
    fake.process(102, 101, "engine worker", 7, 1, cstime=2)
    fake.process(200, 1, "someone else", 500)
    return fake


def test_tree_ticks_sum_the_root_and_every_descendant(proc):
    assert process_tree_ticks(100, str(proc.root)) == (10 + 5 + 3) + (40 + 2) + (7 + 1 + 2)
    assert process_tree_ticks(101, str(proc.root)) == 42 + 10
    assert process_tree_ticks(200, str(proc.root)) == 500
    assert process_tree_ticks(999, str(proc.root)) is None  # no such process


def test_the_others_share_is_the_machine_busy_beyond_the_tree(proc):
    proc.machine(busy=1000, total=4000)
    load = ForeignLoad(root=100, proc=str(proc.root), stat=str(proc.root / "stat"))
    # 200 ticks of the cores pass: the tree uses 60 (its server 40, a reaped child's 20 now
    # in the root's cutime), the machine 110 busy: 50 are someone else's
    proc.process(100, 1, "bench", 10, 5, cutime=3 + 20)
    proc.process(101, 100, "server (api) x)", 80, 2)
    proc.machine(busy=1110, total=4200)
    assert load.stop(max_busy=0.1) == {"foreign_busy": 0.25, "quiet": False}


def test_a_tree_that_used_all_the_busy_time_leaves_the_machine_quiet(proc):
    proc.machine(busy=1000, total=4000)
    load = ForeignLoad(root=100, proc=str(proc.root), stat=str(proc.root / "stat"))
    proc.process(102, 101, "engine worker", 7 + 150, 1, cstime=2)
    proc.machine(busy=1148, total=4200)  # tick accounting may put own time above the machine's
    assert load.stop(max_busy=0.1) == {"foreign_busy": 0.0, "quiet": True}


def test_unreadable_proc_gives_an_unknown_share(tmp_path):
    load = ForeignLoad(root=100, proc=str(tmp_path / "missing"), stat=str(tmp_path / "missing"))
    assert load.stop(max_busy=0.1) == {"foreign_busy": None, "quiet": None}


_SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"


def _ticks_of(pid: int) -> int:
    """A live process's own utime + stime (clock ticks), from the real /proc."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_real_tree_ticks_count_a_child_and_not_a_detached_process():
    """Real /proc, whatever else the machine runs: a child's CPU time shows in this process's
    tree (as the reaped child's, in cutime); a process whose parent exited (re-parented away,
    as another user's job is) does not."""
    hz = os.sysconf("SC_CLK_TCK")
    code = _SPIN.format(seconds=1.0)
    before = process_tree_ticks(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", code])
    _, _, usage = os.wait4(child.pid, 0)  # reaped here, with its resource usage
    child.returncode = 0  # so Popen does not wait for it again
    own = process_tree_ticks(os.getpid()) - before
    child_ticks = (usage.ru_utime + usage.ru_stime) * hz
    assert child_ticks >= 0.2 * hz  # it did run
    assert own >= child_ticks - 2  # ticks are whole: allow the rounding of both counts
    # `sh -c '... &'` returns at once and leaves the spinner without its parent
    detached = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" >/dev/null 2>&1 & echo $!',
                               code], capture_output=True, text=True, check=True)
    spinner = int(detached.stdout.strip())
    try:
        before = process_tree_ticks(os.getpid())
        time.sleep(0.8)
        spun = _ticks_of(spinner)
        own = process_tree_ticks(os.getpid()) - before
    finally:
        try:
            os.kill(spinner, 9)
        except ProcessLookupError:
            pass
    assert spun >= 0.2 * hz  # it did run, outside this tree
    assert own < 0.1 * hz  # this process only slept meanwhile
