"""Crash harness: kill a saving process with SIGKILL at random moments, then load.

A *worker* process first loads the newest checkpoint under a URL and checks it against
:func:`expected_state` (the state is a pure function of the step, so a mix of two saves or a
torn object cannot pass), reports what it found, and then saves step after step until it is
killed. The parent (:class:`CrashHarness`) starts workers from a ``forkserver`` that has
already imported numpy and ckptio (a fresh process in milliseconds instead of a second),
sleeps a seeded random delay, sends SIGKILL, and starts the next worker, which is the fresh
process that loads what the killed one left behind. An *aimed* trial (``run(n, aim=...)``)
kills instead at the first moment the worker's requests show what the test is after (a save's
lease published: :func:`lease_published`; a data object's upload opened:
:func:`upload_opened`): the worker appends each ``put`` and ``create`` request it completes
to its progress file, and the parent polls that file. Random moments can miss a short window
many times in a row (on RGW a small async save holds its lease for ~0.1 s of each second, the
rest being retention's requests).

Per trial the parent checks, from the worker's progress file (appended and flushed line by
line; a SIGKILL loses no data already written to the kernel):

- the loaded step is at least the last step whose save *returned* (durability on return) and
  at most the last step whose save *started* (nothing invented);
- the loaded state equals ``expected_state(step)`` exactly (every tensor, dtype and value).

Tiered (``store_options`` with ``local=``: a tiered :class:`~ckptio.Checkpointer`): the
worker also loads the durable tier alone (as a node that lost its fast tier would) and reports
it; the parent checks it is complete, exact, at least the last step whose drain the killed
worker saw committed, and not newer than the tiered restore. Its aimed trials see the durable
tier's requests only: :func:`lease_published` is then a drain's lease.

Used by ``tests/test_crash.py``; usable for any backend URL.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import ml_dtypes  # imported here so the forkserver preloads it (about 1 s per import)
import numpy as np

from ckptio.lease import is_lease_key
from ckptio.trace import RequestEvent, Trace

__all__ = [
    "SAVE_OPTIONS",
    "CrashHarness",
    "Trial",
    "expected_state",
    "lease_published",
    "main",
    "race",
    "state_mismatch",
    "upload_opened",
]

#: Options the workers save with: small chunks and objects, so one step is several objects
#: and a kill can land between any two of them.
SAVE_OPTIONS: Mapping[str, Any] = {"chunk_size": 256 * 1024, "max_object_size": 768 * 1024}


def expected_state(step: int, big: int = 0) -> dict[str, Any]:
    """The state saved at ``step``: about 2.3 MB in 6 tensors of 4 dtypes, every value a
    function of the step, plus JSON leaves; with ``big`` (bytes) one more uint8 tensor of that
    size (to make objects large enough for multipart uploads)."""
    base = np.arange(256 * 1024, dtype=np.float32)
    state: dict[str, Any] = {
        "model": {
            "w": (base * 1e-3 + step).reshape(512, 512),
            "b": np.full(1024, step, dtype=np.int64),
            "emb": (base[: 64 * 1024] + 2 * step).astype(ml_dtypes.bfloat16).reshape(256, 256),
        },
        "optim": {
            "m": (base * 2e-3 - step).reshape(256, 1024).astype(np.float64)[:, :512].copy(),
            "count": np.array([step, step + 1, step + 2], dtype=np.uint32),
        },
        "flags": np.arange(1000) % (step % 7 + 2) == 0,
        "step": step,
        "lr": 1.0 / (step + 1),
        "history": [step - 1, step - 2, {"note": f"saved at step {step}"}],
    }
    if big:
        state["big"] = (np.arange(big, dtype=np.uint32) * 2654435761 + step).astype(np.uint8)
    return state


def state_mismatch(got: Any, want: Any, path: str = "") -> str | None:
    """None if ``got`` equals ``want`` exactly (arrays: dtype, shape and bytes), else a
    description of the first difference."""
    if isinstance(want, np.ndarray):
        if not isinstance(got, np.ndarray):
            return f"{path}: expected an array, got {type(got).__name__}"
        if got.dtype != want.dtype or got.shape != want.shape:
            return f"{path}: {got.dtype}{got.shape} != {want.dtype}{want.shape}"
        if got.tobytes() != want.tobytes():
            return f"{path}: values differ"
        return None
    if isinstance(want, Mapping):
        if not isinstance(got, Mapping) or set(got) != set(want):
            return f"{path}: keys {sorted(got) if isinstance(got, Mapping) else got!r} != {sorted(want)}"
        for k in want:
            problem = state_mismatch(got[k], want[k], f"{path}/{k}")
            if problem:
                return problem
        return None
    if isinstance(want, list | tuple):
        if type(got) is not type(want) or len(got) != len(want):
            return f"{path}: {got!r:.60} != {want!r:.60}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            problem = state_mismatch(g, w, f"{path}/{i}")
            if problem:
                return problem
        return None
    if type(got) is not type(want) or got != want:
        return f"{path}: {got!r:.60} != {want!r:.60}"
    return None


def _worker(
    url: str,
    mode: str,
    progress_path: str,
    conn: Connection,
    env: Mapping[str, str],
    store_options: Mapping[str, Any],
    keep_last: int | None,
    big: int,
) -> None:
    """Load and check the newest checkpoint, report it on ``conn``, then save forever."""
    os.environ.update(env)
    from ckptio.checkpoint import Checkpointer

    progress = open(progress_path, "a", buffering=1)  # noqa: SIM115 - lives until SIGKILL
    lock = threading.Lock()  # drains report from their own thread
    latest = durable = None
    try:
        options = {**SAVE_OPTIONS, **store_options}
        # tiered (``local=``): the durable tier's requests, so the drains'
        options["trace"] = _Announcing(progress, lock)
        ck = Checkpointer(
            url,
            keep_last=keep_last,
            async_save=mode != "sync",
            snapshot="fork" if mode == "fork" else "copy",
            **options,
        )
        latest = ck.latest()
        problem = None
        if latest is not None:
            problem = state_mismatch(ck.load(latest), expected_state(latest, big))
        # a manifest is published atomically: none may ever be torn (latest() would skip it)
        from ckptio.checkpoint import committed_steps, open_checkpoint, read_manifest
        from ckptio.checkpoint.tiered import TieredCheckpointer

        engine = ck.engine
        tiered = isinstance(engine, TieredCheckpointer)
        for store in (
            (ck.store, engine.fast.store) if isinstance(engine, TieredCheckpointer) else (ck.store,)
        ):
            for s in committed_steps(store):
                try:
                    read_manifest(store, s)
                except FileNotFoundError:
                    continue  # deleted by retention meanwhile
                except Exception as err:  # any failure here is the finding
                    problem = problem or f"{store.url} step {s}: manifest does not validate: {err}"
        if tiered and not problem:  # the durable tier alone, as a replaced node reads it
            try:
                reader = open_checkpoint(ck.store)
            except FileNotFoundError:
                pass
            else:
                durable = reader.step
                wrong = state_mismatch(reader.state(), expected_state(durable, big))
                problem = wrong and f"durable tier alone, step {durable}: {wrong}"
    except Exception as err:  # reported to the parent, which fails the test with it
        conn.send({"latest": latest, "durable": durable, "problem": f"{type(err).__name__}: {err}"})
        return
    conn.send({"latest": latest, "durable": durable, "problem": problem})

    def drained(result: Any) -> None:
        if result.status == "durable":
            with lock:
                progress.write(f"durable {result.step}\n")

    if problem or conn.recv() != "go":
        return
    step = (latest or 0) + 1
    previous = None
    while True:
        with lock:
            progress.write(f"start {step}\n")
        handle = ck.save(expected_state(step, big), step)
        drain = getattr(handle, "drain", None)
        if drain is not None:
            drain.future.add_done_callback(lambda f: drained(f.result()))
        with lock:
            if mode == "sync":
                progress.write(f"committed {step}\n")
            elif previous is not None:  # an async save returns after waiting for the previous one
                progress.write(f"committed {previous}\n")
        previous = step
        step += 1


class _Announcing(Trace):
    """A trace that also appends each completed ``put`` and ``create`` request to the
    progress file (``req OP KEY``), for aimed kills."""

    def __init__(self, progress: Any, lock: threading.Lock) -> None:
        super().__init__()
        self._progress, self._progress_lock = progress, lock

    def record(self, event: RequestEvent) -> None:
        super().record(event)
        if event.op in ("put", "create") and event.outcome == "ok":
            with self._progress_lock:
                self._progress.write(f"req {event.op} {event.key}\n")


Requests = Sequence[tuple[str, str]]
"""``(op, key)`` of the ``put`` and ``create`` requests a worker completed so far."""


def lease_published(requests: Requests) -> bool:
    """An aim: a save published its lease (its data comes next)."""
    return any(op == "put" and is_lease_key(key) for op, key in requests)


def upload_opened(requests: Requests) -> bool:
    """An aim: a streamed data object was opened (on S3: a multipart upload started)."""
    return any(op == "create" and "/data/" in key for op, key in requests)


@dataclass
class Trial:
    """One kill: what the killed worker had done, and what the next worker loaded."""

    delay: float
    """Seconds between the worker starting to save and SIGKILL."""
    last_started: int | None
    last_committed: int | None
    last_durable: int | None = None
    """Tiered: the last step whose drain the worker saw committed on the durable tier."""
    loaded: int | None = None
    durable_loaded: int | None = None
    """Tiered: the step the next worker loaded from the durable tier alone."""
    debris: bool = False
    """The kill left temp files, open uploads or data without a manifest (it landed mid-save)."""


@dataclass
class CrashHarness:
    """Kill-and-reload trials against one URL (see the module docstring)."""

    url: str
    mode: str  # "sync" | "async" | "fork" (async, snapshot="fork")
    workdir: str
    seed: int = 0
    max_delay: float = 0.4
    """Seconds: each kill comes uniform(min_delay, max_delay) after the worker starts saving
    (the window doubles, up to 16x, after a trial in which no save completed)."""
    min_delay: float = 0.0
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment for the workers (e.g. the S3 endpoint and test credentials)."""
    store_options: Mapping[str, Any] = field(default_factory=dict)
    """Checkpointer and store options (override :data:`SAVE_OPTIONS`)."""
    big: int = 0
    """Bytes of the extra tensor of :func:`expected_state`."""
    keep_last: int | None = 2
    trials: list[Trial] = field(default_factory=list)
    has_debris: Any = None
    """Optional ``callable() -> bool`` run after each kill to classify it."""

    def __post_init__(self) -> None:
        if self.mode not in ("sync", "async", "fork"):
            raise ValueError(f"mode must be 'sync', 'async' or 'fork', got {self.mode!r}")
        self._rng = random.Random(self.seed)
        self._stretch = 1.0
        self._workers = 0
        self._ctx = _context()

    def _start(self, progress: str) -> tuple[Any, Connection, dict[str, Any]]:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_worker,
            args=(
                self.url,
                self.mode,
                progress,
                child,
                dict(self.env),
                dict(self.store_options),
                self.keep_last,
                self.big,
            ),
            daemon=True,
        )
        proc.start()
        child.close()
        if not parent.poll(60):
            proc.kill()
            raise TimeoutError(f"crash worker for {self.url} did not report within 60 s")
        return proc, parent, parent.recv()

    def run(self, n: int, aim: Callable[[Requests], bool] | None = None) -> list[Trial]:
        """Run ``n`` kill trials, then one last fresh load; return the trials. Raises
        AssertionError on the first violated guarantee. ``aim``: kill as soon as
        ``aim(requests)`` is true for the requests the worker completed (polled every
        millisecond, for up to :data:`AIM_SECONDS`) rather than after a random delay."""
        for i in range(n + 1):
            # numbered across calls: a later run() must not read an earlier worker's file
            self._workers += 1
            progress = os.path.join(self.workdir, f"progress-{self.mode}-{self._workers}.txt")
            proc, conn, report = self._start(progress)
            if self.trials:
                self._check(self.trials[-1], report)
            elif report["latest"] is not None or report["problem"]:
                raise AssertionError(f"expected an empty store at the start, worker found {report}")
            if i == n:
                conn.send("stop")
                proc.join(30)
                break
            conn.send("go")
            if aim is None:
                delay = self._rng.uniform(self.min_delay, self.max_delay * self._stretch)
                time.sleep(delay)  # the random moment of the kill, not a synchronisation
            else:
                delay = _wait_for(aim, progress, time.monotonic())
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(30)
            conn.close()
            started, committed, durable = _read_progress(progress)
            trial = Trial(delay, started, committed, durable)
            # on a slow machine no save may finish within max_delay: stretch the window (up
            # to 16x) until saves commit again, so the trials keep exercising later steps
            self._stretch = 1.0 if committed is not None else min(self._stretch * 2, 16.0)
            if self.has_debris is not None:
                trial.debris = bool(self.has_debris())
            self.trials.append(trial)
        return self.trials

    def _check(self, trial: Trial, report: Mapping[str, Any]) -> None:
        trial.loaded = report["latest"]
        trial.durable_loaded = report.get("durable")
        if report["problem"]:
            raise AssertionError(
                f"after a kill, step {report['latest']} loaded wrong: {report['problem']}"
            )
        drained = [t.last_durable for t in self.trials if t.last_durable is not None]
        if drained and (trial.durable_loaded is None or trial.durable_loaded < max(drained)):
            raise AssertionError(
                f"a drain that committed was lost: step {max(drained)} was durable, the durable "
                f"tier alone gave {trial.durable_loaded}"
            )
        if trial.durable_loaded is not None and (
            trial.loaded is None or trial.loaded < trial.durable_loaded
        ):
            raise AssertionError(
                f"the tiered restore took step {trial.loaded}, older than the durable tier's {trial.durable_loaded}"
            )
        floor = trial.last_committed
        before = [t.loaded for t in self.trials[:-1] if t.loaded is not None]
        floor = max([x for x in (floor, *before) if x is not None], default=None)
        if floor is not None and (trial.loaded is None or trial.loaded < floor):
            raise AssertionError(
                f"a save that returned was lost: step {floor} was committed, the fresh process "
                f"loaded {trial.loaded}"
            )
        ceiling = max(
            [
                x
                for x in (trial.last_started, *(t.last_started for t in self.trials))
                if x is not None
            ],
            default=None,
        )
        if trial.loaded is not None and (ceiling is None or trial.loaded > ceiling):
            raise AssertionError(f"loaded step {trial.loaded} that no save ever started")

    def summary(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "mode": self.mode,
            "trials": len(self.trials),
            "killed_mid_save": sum(t.debris for t in self.trials),
            "steps_committed": max((t.loaded or 0 for t in self.trials), default=0),
        }


AIM_SECONDS = 60.0
"""How long an aimed trial waits for its moment before it kills anyway."""


def _wait_for(aim: Callable[[Requests], bool], progress: str, start: float) -> float:
    """Poll ``aim`` on the requests in ``progress`` until it is true or :data:`AIM_SECONDS`
    passed; the seconds waited."""
    requests: list[tuple[str, str]] = []
    tail = ""  # a line still being written
    with open(progress) as f:
        while not aim(requests) and time.monotonic() - start < AIM_SECONDS:
            time.sleep(0.001)
            *lines, tail = (tail + f.read()).split("\n")
            for parts in map(str.split, lines):
                if len(parts) == 3 and parts[0] == "req":
                    requests.append((parts[1], parts[2]))
    return time.monotonic() - start


def _read_progress(path: str) -> tuple[int | None, int | None, int | None]:
    started = committed = durable = None
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 2 or not parts[1].isdigit():
                    continue  # a line cut by the kill
                if parts[0] == "start":
                    started = int(parts[1])
                elif parts[0] == "committed":
                    committed = int(parts[1])
                elif parts[0] == "durable":
                    durable = max(durable or 0, int(parts[1]))
    except FileNotFoundError:
        pass
    return started, committed, durable


_CTX: Any = None


def _context() -> Any:
    """A forkserver context whose server has imported numpy, ml_dtypes and ckptio."""
    global _CTX
    if _CTX is None:
        ctx = multiprocessing.get_context("forkserver")
        preload = [
            "ckptio.testing.crash",
            "ckptio.checkpoint",
            "ckptio.backends.local",
        ]
        try:
            import boto3  # noqa: F401  - only to know whether to preload it

            preload.append("boto3")
        except ImportError:
            pass
        ctx.set_forkserver_preload(preload)
        _CTX = ctx
    return _CTX


def main() -> None:
    """``python -m ckptio.testing.crash URL [sync|async|fork] [trials]``: run trials, print JSON."""
    import sys
    import tempfile

    url = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else "sync"
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    with tempfile.TemporaryDirectory() as work:
        h = CrashHarness(url, mode, work)
        h.run(n)
        print(json.dumps(h.summary()))


if __name__ == "__main__":
    main()


# -- concurrent writers -------------------------------------------------------------------------


def _race_worker(
    url: str,
    step: int,
    writer: int,
    barrier: Any,
    conn: Connection,
    env: Mapping[str, str],
    at_publish: bool,
) -> None:
    """Save ``expected_state(10 * step + writer)`` as ``step``, starting together with the
    other writers (and, with ``at_publish``, also reaching the commit together)."""
    os.environ.update(env)
    from ckptio.checkpoint import Checkpointer

    ck = Checkpointer(url, **SAVE_OPTIONS)
    if at_publish:
        publish = ck.store.publish

        def publish_together(key: str, data: bytes, *, overwrite: bool = True) -> None:
            if key.endswith("manifest.json"):
                barrier.wait(60)
            publish(key, data, overwrite=overwrite)

        ck.store.publish = publish_together  # type: ignore[method-assign]
    state = expected_state(10 * step + writer)
    barrier.wait(60)
    try:
        ck.save(state, step, metadata={"writer": writer})
    except Exception as err:  # reported to the parent
        conn.send((type(err).__name__, str(err)))
    else:
        conn.send(("ok", ""))
    ck.close()


def race(
    url: str,
    step: int,
    *,
    writers: int = 2,
    at_publish: bool = False,
    env: Mapping[str, str] | None = None,
) -> list[tuple[str, str]]:
    """Start ``writers`` processes that save ``step`` under ``url`` at the same moment;
    return each one's ``(outcome, message)``: ``("ok", "")`` or the error's class and text."""
    ctx = _context()
    barrier = ctx.Barrier(writers)
    procs, conns = [], []
    for w in range(writers):
        parent, child = ctx.Pipe()
        p = ctx.Process(
            target=_race_worker,
            args=(url, step, w, barrier, child, dict(env or {}), at_publish),
            daemon=True,
        )
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)
    out = []
    for p, conn in zip(procs, conns, strict=True):
        if not conn.poll(120):
            p.kill()
            raise TimeoutError(f"writer {p.pid} of {url} did not finish within 120 s")
        out.append(conn.recv())
        p.join(30)
    return out
