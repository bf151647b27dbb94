"""On another node of the test cluster, beside a save loop: until the file DONE exists, apply
retention (keep the newest step) and gc (no grace for retired steps; temp files younger than
TEMP_MIN_AGE_SECONDS kept, as retention keeps them: a save's lease is a temp file for an
instant) to URL, round after round (5 a second).
Prints one JSON line: the rounds, when the first began, and the keys removed."""

import json
import os
import sys
import threading
import time

from ckptio.checkpoint import collect_garbage, committed_steps, retain
from ckptio.lease import TEMP_MIN_AGE_SECONDS
from ckptio.registry import open_store


def main() -> None:
    url, done = sys.argv[1], sys.argv[2]
    store = open_store(url)
    rounds, first, removed = 0, 0.0, []
    while not os.path.exists(done):
        first = first or time.time()
        steps = committed_steps(store)
        if steps:
            removed += retain(store, steps[-1], keep_last=1, grace=0).removed
        removed += collect_garbage(store, older_than=TEMP_MIN_AGE_SECONDS, grace=0)
        rounds += 1
        threading.Event().wait(0.2)  # pacing, not synchronisation: leave the savers a core
    print(json.dumps({"rounds": rounds, "first": first, "removed": removed}), flush=True)


if __name__ == "__main__":
    main()
