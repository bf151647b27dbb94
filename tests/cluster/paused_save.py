"""On one node of the test cluster: save step STEP of a small state to URL, stopping this
process (SIGSTOP) mid-save, so that the test can run gc from another node while the save is
in flight; the test resumes it with SIGCONT. Prints ``OK`` or ``FAILED: <error>``.

``python paused_save.py URL STEP data``: stop right after the first data object is complete
(the save's lease, with its default length, is published before any data).
``python paused_save.py URL STEP manifest``: a 2 s lease, refreshed every 0.25 s; stop just
before the manifest is published (every object written), every thread with it, so the lease
lapses while the process is stopped."""

import os
import signal
import sys
import threading

import numpy as np

import ckptio
from ckptio import lease
from ckptio.registry import open_store
from ckptio.trace import RequestEvent, Trace


class PauseAfterFirstObject(Trace):
    paused = False

    def record(self, event: RequestEvent) -> None:
        super().record(event)
        if not self.paused and event.op == "rename" and "/data/" in event.key:
            self.paused = True
            os.kill(os.getpid(), signal.SIGSTOP)


def state(step: int) -> dict[str, np.ndarray]:
    return {"w": np.arange(4 << 20, dtype=np.float32) + step}  # 16 MiB, 4 objects of 4 MiB


def main() -> None:
    url, step, at = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if at == "data":
        store = open_store(url, trace=PauseAfterFirstObject())
    else:
        lease.LEASE_SECONDS, lease.REFRESH_SECONDS = 2.0, 0.25
        store = open_store(url)
        publish = store.publish

        def held(key: str, data: bytes, **options: object) -> None:
            if key.endswith("/manifest.json"):  # every object is written; the thread that
                # publishes stops before it goes on (the lease's thread with the process)
                signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
            return publish(key, data, **options)  # type: ignore[arg-type]

        store.publish = held  # type: ignore[method-assign]
    try:
        ckptio.Checkpointer(store, max_object_size="4MiB", chunk_size="4MiB").save(
            state(step), step
        )
    except Exception as err:  # the outcome is the test's to judge
        print(f"FAILED: {type(err).__name__}: {err}", flush=True)
        return
    print("OK", flush=True)


if __name__ == "__main__":
    main()
