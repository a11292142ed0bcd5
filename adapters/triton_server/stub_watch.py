"""The Python stub that runs the engine ends when ``tritonserver`` does.

Triton's stub watches its parent itself, but when the server dies without unloading the
model (killed, crashed, or past its ``--exit-timeout-secs``), the stub's own clean-up can
hang for good holding the GIL (measured here: most SIGKILLs of the server left the stub
running), so no Python thread of the stub can end it. ``end_stub_with_server`` starts a
tiny ``/bin/sh`` watcher instead, which needs no GIL: every half second it reads the
stub's parent from ``/proc/<stub>/stat``; once that is no longer the server, it SIGKILLs the
stub. It also ends, doing nothing, when the stub ends first (an unload), so reloads do
not pile watchers up.
"""
from __future__ import annotations

import os
import subprocess

WATCH_PERIOD_S = 0.5

# $1: the stub's pid, $2: the server's pid. /proc/<pid>/stat field 4 is the parent pid
# (field 2, the command name, is the stub's: no spaces).
_WATCH_SCRIPT = f"""
while [ -r /proc/$1/stat ] && [ "$(cut -d' ' -f4 /proc/$1/stat)" = "$2" ]; do
  sleep {WATCH_PERIOD_S}
done
[ -r /proc/$1/stat ] && kill -9 $1
exit 0
"""


def end_stub_with_server() -> subprocess.Popen:
    """Start the watcher for this process (the stub) and its parent (the server)."""
    return subprocess.Popen(["/bin/sh", "-c", _WATCH_SCRIPT, "stub-watch", str(os.getpid()),
                             str(os.getppid())], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
