"""On one node of the test cluster: save step 1 of a small state to URL, and stop (SIGSTOP)
this process right after the first data object is complete (its save's lease is published
before any data), so that the test can run gc from another node while the save is in flight;
the test resumes it with SIGCONT. Prints ``OK`` or ``FAILED: <error>``."""

import os
import signal
import sys

import numpy as np

import ckptio
from ckptio.registry import open_store
from ckptio.trace import RequestEvent, Trace


class PauseAfterFirstObject(Trace):
    paused = False

    def record(self, event: RequestEvent) -> None:
        super().record(event)
        if not self.paused and event.op == "rename" and "/data/" in event.key:
            self.paused = True
            os.kill(os.getpid(), signal.SIGSTOP)


def main() -> None:
    store = open_store(sys.argv[1], trace=PauseAfterFirstObject())
    state = {"w": np.arange(4 << 20, dtype=np.float32)}  # 16 MiB, 4 objects of 4 MiB
    try:
        ckptio.Checkpointer(store, max_object_size="4MiB", chunk_size="4MiB").save(state, 1)
    except Exception as err:  # the outcome is the test's to judge
        print(f"FAILED: {type(err).__name__}: {err}", flush=True)
        return
    print("OK", flush=True)


if __name__ == "__main__":
    main()
