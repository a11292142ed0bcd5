"""``python -m paged_core.executor.worker_process``: the main of a local worker rank's process.

Started by ``launch.start_worker``, which writes ``worker_main``'s arguments,
pickled, on this process's stdin. Nothing in ``paged_core`` imports this
module, so ``-m`` runs it exactly once, as ``__main__``, and the user's main
module is never imported here.
"""
import pickle
import sys

from .rank_worker import worker_main

if __name__ == "__main__":
    worker_main(*pickle.load(sys.stdin.buffer))
