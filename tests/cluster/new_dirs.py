"""On one node of the test cluster: PROCS processes, each publishing one small object into
the directories of a new round, ROUNDS rounds, every process of every node starting round r
at START + r * PERIOD seconds (the nodes share this machine's clock), so that they all make
the same new directories at once, as the ranks of a save make its step's directories.
Prints one JSON line: the failures (round, key, error)."""

import json
import multiprocessing
import socket
import sys
import time

from ckptio.registry import open_store

PERIOD = 0.25


def publish_rounds(
    url: str, start: float, rounds: int, proc: int, out: "multiprocessing.Queue[list[str]]"
) -> None:
    store = open_store(url)
    host = socket.gethostname()
    failures = []
    for r in range(rounds):
        time.sleep(max(0.0, start + r * PERIOD - time.time()))
        key = f"r{r:03d}/data/deeper/{host}-{proc}.bin"
        try:
            store.publish(key, b"x" * 64, overwrite=False)
        except Exception as err:  # every failure is reported, none stops the others
            failures.append(f"{r} {key}: {type(err).__name__}: {err}")
    out.put(failures)


def main() -> None:
    url, start, rounds, procs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    out: multiprocessing.Queue[list[str]] = multiprocessing.Queue()
    workers = [
        multiprocessing.Process(target=publish_rounds, args=(url, start, rounds, i, out))
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    failures = [f for _ in workers for f in out.get()]
    for w in workers:
        w.join()
    print(json.dumps({"failures": failures}), flush=True)


if __name__ == "__main__":
    main()
