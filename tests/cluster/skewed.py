"""``python skewed.py SECONDS MODULE|SCRIPT ARGS...``: run a module (``-m NAME``) or a script
with this process's wall clock (``time.time``, ``time.time_ns``) offset by SECONDS: a host
whose clock is off. The kernel keeps one wall clock for every namespace (a time namespace
offsets only the monotonic and boot-time clocks), and libfaketime breaks Python's sleeps
(EINVAL from clock_nanosleep, or a hang), so the offset is applied here, to the clock that
ckptio's leases read."""

import runpy
import sys
import time


def main() -> None:
    offset = float(sys.argv[1])
    real, real_ns = time.time, time.time_ns
    time.time = lambda: real() + offset  # type: ignore[assignment]
    time.time_ns = lambda: real_ns() + int(offset * 1e9)  # type: ignore[assignment]
    if sys.argv[2] == "-m":
        sys.argv = [sys.argv[3], *sys.argv[4:]]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[2:]
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
