"""Storage faults at the checkpoint level: saves survive transient S3 failures and the trace
and result files count the retries; past the retry budget a save fails clearly with nothing
visible; a full or failing local disk fails the save clearly and earlier checkpoints load.

What is real and what is injected:

- S3: real HTTP faults from a loopback proxy (``ckptio.testing.faults``) in front of a real
  moto server: 503 SlowDown, 500 InternalError, dropped connections, slow responses.
- ENOSPC: a real 4 MiB tmpfs (``mount -t tmpfs``, needs root; skipped with a reason
  otherwise).
- EFBIG: a real file-size limit (``RLIMIT_FSIZE``) in a child process.
- EIO: real, from the kernel: the saves and loads go through a FUSE passthrough filesystem
  (``ckptio.testing.faultyfs``, a separate server process) switched to fail writes, fsyncs
  or reads of data objects with EIO (needs root and ``/dev/fuse``; skipped with a reason
  otherwise, failed under ``CI=true``). The older *injected* EIO tests remain: they replace
  ``os.pwrite`` / ``os.fsync`` / ``os.preadv`` in the test process by functions that raise
  ``OSError(EIO)``, and run where FUSE is unavailable (no device-mapper ``error`` target is
  available in this container).
- The failing manifest publish: ``LocalStore.publish`` replaced (injected).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckptio
from ckptio import errors
from ckptio.registry import open_store
from ckptio.store import RetryPolicy
from ckptio.testing import faultyfs
from ckptio.testing.crash import expected_state, state_mismatch
from ckptio.testing.moto import MOTO_AND_RGW

FAST_RETRIES = RetryPolicy(max_attempts=8, base_delay=0.01, max_delay=0.1)
"""The default number of attempts with shorter sleeps, to keep the tests quick."""


def big_state(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal((1536, 1024), dtype=np.float32), "step": step}  # 6 MiB


# -- S3 ---------------------------------------------------------------------------------------


def _s3_store(bucket: str, endpoint: str):
    store = open_store(f"s3://{bucket}/run", endpoint_url=endpoint, part_size="5MiB", streams=4)
    store.retry_policy = FAST_RETRIES
    return store


@pytest.mark.s3
@MOTO_AND_RGW
def test_async_checkpointer_through_bursts_of_faults(s3_bucket, s3_client, fault_proxy):
    """Five async saves (multipart objects) with retention, then load and verify, all
    through a proxy that fails >= 5% of requests of every kind (bursts of SlowDown, 500s,
    resets, slow responses): everything succeeds; the trace counts one retry per fault."""
    proxy = fault_proxy(
        rate=0.08, kinds=("slowdown", "internal", "drop", "slow"), slow_seconds=0.2, seed=21
    )
    store = _s3_store(s3_bucket, proxy.url)
    with ckptio.Checkpointer(store, async_save=True, keep_last=2, max_object_size="8MiB") as ck:
        bursts = {3: ("slowdown", 4), 4: ("slow", 3)}
        for step in range(1, 6):
            if step in bursts:  # a burst: the next N requests all get the fault, then recovery
                kind, n = bursts[step]
                ck.wait()
                proxy.max_faults = proxy.stats().get("faults", 0) + n
                proxy.set(rate=1.0, kinds=(kind,))
            ck.save(big_state(step), step)
            if step in bursts:
                ck.wait()
                proxy.max_faults = None
                proxy.set(rate=0.08, kinds=("slowdown", "internal", "drop", "slow"))
        ck.wait()
        assert ck.steps() == [4, 5]
        back = ck.load(5)
        assert ck.open(5).verify() == []
    stats = proxy.stats()
    proxy.set(rate=0.0)
    assert np.array_equal(back["w"], big_state(5)["w"])
    events = store.trace.events()
    requests = stats.get("requests", 0)
    faults = stats.get("faults", 0)
    assert requests and faults / requests >= 0.05, stats
    retried = [e for e in events if e.outcome in ("retry", "throttled")]
    # every fault but a slow response (which still succeeds) costs exactly one retry
    assert len(retried) == faults - stats.get("slow", 0), (len(retried), stats)
    print(stats, f"{len(retried)} retries traced")
    assert sum(e.outcome == "throttled" for e in events) >= 4  # the SlowDown burst
    assert stats.get("slow", 0) >= 3  # the slow-response burst (slower, but no retry needed)
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


@pytest.mark.s3
@MOTO_AND_RGW
def test_async_save_past_the_retry_budget_fails_clearly_and_commits_nothing(
    s3_bucket, s3_client, fault_proxy
):
    proxy = fault_proxy(rate=0.0, seed=3)
    store = _s3_store(s3_bucket, proxy.url)
    ck = ckptio.Checkpointer(store, async_save=True, max_object_size="8MiB")
    ck.save(big_state(1), 1).wait()
    # every upload of data fails from now on; creating and aborting uploads still works (and
    # so does the save's lease, a small PUT outside data/)
    proxy.methods = {"PUT"}
    proxy.paths = {"/data/"}
    proxy.set(rate=1.0, kinds=("slowdown", "internal", "drop"))
    ck.save(big_state(2), 2)
    with pytest.raises(errors.SaveFailedError) as info:
        ck.wait()
    text = str(info.value)
    assert "step 2" in text and "nothing committed" in text and "failed 8 times" in text, text
    proxy.set(rate=0.0)
    assert ck.steps() == [1]
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])]
    assert not [k for k in keys if "step-0000000002" in k], keys  # nothing of step 2 visible
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    assert np.array_equal(ck.load(1)["w"], big_state(1)["w"])
    ck.close()


@pytest.mark.s3
@MOTO_AND_RGW
def test_runner_results_count_retries(s3_bucket, fault_proxy, tmp_path):
    """The comparison suite's result files record the retries a faulty store needed."""
    import pyarrow.parquet as pq

    from ckptio.dist import SingleProcess
    from ckptio.runner import RunSettings, run_workload
    from ckptio.workload import make_plan

    proxy = fault_proxy(rate=0.1, kinds=("slowdown", "internal", "drop"), seed=8)
    plan = make_plan("llama3-8b", total_size="12MiB", object_size="1MiB")
    summary = run_workload(
        f"s3://{s3_bucket}/bench",
        plan,
        RunSettings(out_dir=tmp_path / "out", options={"endpoint_url": proxy.url, "streams": 4}),
        SingleProcess(),
    )
    faults = proxy.stats().get("faults", 0)
    proxy.set(rate=0.0)
    assert faults > 0
    counted = sum(r.get("retries", 0) + r.get("throttled", 0) for r in summary.runs)
    assert counted > 0, summary.runs
    requests = [p for p in summary.paths if "request" in p.name and p.suffix == ".parquet"]
    assert requests, summary.paths
    outcomes = pq.read_table(requests[0]).column("outcome").to_pylist()
    assert sum(o in ("retry", "throttled") for o in outcomes) == counted


# -- local disk -------------------------------------------------------------------------------


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "4m"):
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_enospc_on_a_full_tmpfs(tmp_path):
    """A real 4 MiB filesystem: a 6 MiB save fails with a clear error, leaves nothing
    behind, and the earlier checkpoint still loads; a small save then succeeds."""
    with small_tmpfs(tmp_path / "disk") as disk:
        url = f"file://{disk}/run"
        small = {"w": np.arange(100_000, dtype=np.float32)}  # 400 kB
        ckptio.save(small, url, step=1)
        with pytest.raises(errors.SaveFailedError) as info:
            ckptio.save(big_state(2), url, step=2)
        text = str(info.value)
        assert "No space left on device" in text and "nothing committed" in text, text
        chain = [info.value.__cause__]
        assert isinstance(chain[0], errors.NoSpaceError), chain
        with open_store(url) as store:
            assert store.list_incomplete("step-") == []  # temp files removed by abort
            assert [k for k in store.list("step-") if "step-0000000002" in k] == []
        assert np.array_equal(ckptio.load(url)["w"], small["w"])
        ckptio.save(small, url, step=3)
        assert ckptio.verify(url, 3) == []


def test_enospc_preallocate_fails_at_the_start(tmp_path):
    with small_tmpfs(tmp_path / "disk") as disk:
        url = f"file://{disk}/run?preallocate=1"
        ckptio.save({"x": np.zeros(1000)}, url, step=1)
        with pytest.raises(errors.SaveFailedError, match="allocate space"):
            ckptio.save(big_state(2), url, step=2)
        assert ckptio.Checkpointer(url).steps() == [1]


EFBIG_SCRIPT = textwrap.dedent(
    """
    import resource, signal, sys
    import numpy as np
    import ckptio
    from ckptio import errors
    url = sys.argv[1]
    ckptio.save({"w": np.arange(1000, dtype=np.float32)}, url, step=1)
    # a file-size limit (ulimit -f): writes past it fail with EFBIG once SIGXFSZ is ignored
    # (its default action kills the process, which the crash tests cover)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20))
    try:
        ckptio.save({"w": np.zeros(2**20, dtype=np.float32)}, url, step=2)
    except errors.SaveFailedError as err:
        print("FAILED", type(err.__cause__).__name__, err)
    else:
        print("SAVED")
    print("LOADED", ckptio.load(url)["w"].shape)
    """
)


def test_efbig_under_a_file_size_limit(tmp_path):
    script = tmp_path / "efbig.py"
    script.write_text(EFBIG_SCRIPT)
    url = f"file://{tmp_path}/run"
    proc = subprocess.run(
        [sys.executable, str(script), url], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "FAILED NoSpaceError" in proc.stdout and "File too large" in proc.stdout, proc.stdout
    assert "LOADED (1000,)" in proc.stdout
    assert ckptio.Checkpointer(url).steps() == [1]
    with open_store(url) as store:
        assert store.list_incomplete("step-") == []


def _eio(*args: Any, **kwargs: Any):
    raise OSError(errno.EIO, os.strerror(errno.EIO))


@pytest.mark.parametrize("call", ["pwrite", "fsync"])
def test_eio_while_saving_injected(tmp_path, monkeypatch, call):
    url = f"file://{tmp_path}/run"
    ckptio.save(expected_state(1), url, step=1)
    import ckptio.backends.local as local

    real = getattr(os, call)

    def failing(fd, *args):  # EIO on data objects (the save's lease and directories work)
        if "/data/" in os.readlink(f"/proc/self/fd/{fd}"):
            _eio()
        return real(fd, *args)

    monkeypatch.setattr(local.os, call, failing)
    with pytest.raises(errors.SaveFailedError) as info:
        ckptio.save(expected_state(2), url, step=2)
    monkeypatch.undo()
    text = str(info.value)
    assert "Input/output error" in text and "nothing committed" in text, text
    assert ckptio.Checkpointer(url).steps() == [1]
    assert state_mismatch(ckptio.load(url), expected_state(1)) is None
    with open_store(url) as store:
        assert store.list_incomplete("step-") == []


def test_eio_while_loading_injected(tmp_path, monkeypatch):
    url = f"file://{tmp_path}/run"
    ckptio.save(expected_state(1), url, step=1)
    import ckptio.backends.local as local

    real_preadv = os.preadv

    def preadv(fd, buffers, offset):  # EIO on data objects only (the manifest reads fine)
        if "/data/" in os.readlink(f"/proc/self/fd/{fd}"):
            _eio()
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(local.os, "preadv", preadv)
    # an unreadable object makes the step unloadable: skipped loudly, and with no older step
    # the error is raised
    with (
        pytest.warns(errors.DamagedCheckpointWarning, match="skipping step 1"),
        pytest.raises(
            errors.StorageError, match=r"cannot read .*step-0000000001/data/.*Input/output error"
        ),
    ):
        ckptio.load(url)
    monkeypatch.undo()
    assert state_mismatch(ckptio.load(url), expected_state(1)) is None


# -- local disk, real EIO from a FUSE filesystem ------------------------------------------------


@pytest.fixture
def faulty_disk(tmp_path):
    """A FUSE passthrough mount (``ckptio.testing.faultyfs``) that fails chosen operations
    with a real EIO from the kernel; skips without /dev/fuse or root, fails under CI=true."""
    fs = faultyfs.start_or_skip(tmp_path)
    try:
        yield fs
    finally:
        fs.stop()


def _step_files(fs: faultyfs.FaultyFS, step: int) -> list[str]:
    """Files of ``step`` in the backing directory (temp files included)."""
    root = Path(fs.backing) / "run" / f"step-{step:010d}"
    return sorted(str(p) for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.mark.fuse
@pytest.mark.parametrize("direct", ["0", "1"])
@pytest.mark.parametrize("op", ["write", "fsync"])
def test_eio_while_saving_from_a_faulty_filesystem(faulty_disk, op, direct):
    """The kernel answers EIO to every write (or fsync) of a data object: the save fails
    naming the object and the error, commits nothing, and step 1 still loads and verifies;
    with the faults off the same save succeeds."""
    url = f"file://{faulty_disk.mountpoint}/run?direct={direct}"
    ckptio.save(expected_state(1), url, step=1)
    with faulty_disk.faults([op], match="/data/"), pytest.raises(errors.SaveFailedError) as info:
        ckptio.save(expected_state(2), url, step=2)
    text = str(info.value)
    assert "Input/output error" in text and "nothing committed" in text, text
    assert f"cannot {op} {faulty_disk.mountpoint}/run/step-0000000002/data/" in text, text
    cause = info.value.__cause__
    assert isinstance(cause, errors.StorageError) and cause.errno == errno.EIO, repr(cause)
    assert ckptio.Checkpointer(url).steps() == [1]
    with open_store(url) as store:
        assert store.list_incomplete("step-") == []
        assert [k for k in store.list("step-") if "step-0000000002" in k] == []
    assert _step_files(faulty_disk, 2) == []  # temp files removed too
    assert state_mismatch(ckptio.load(url), expected_state(1)) is None
    assert ckptio.verify(url, 1) == []
    ckptio.save(expected_state(2), url, step=2)  # faults off: the disk works again
    assert state_mismatch(ckptio.load(url, 2), expected_state(2)) is None


@pytest.mark.fuse
@pytest.mark.parametrize("direct", ["0", "1"])
def test_eio_while_loading_from_a_faulty_filesystem(faulty_disk, direct):
    """The kernel answers EIO to reads of data objects (the manifest reads fine): the load
    fails naming the object and the error; with the faults off it loads and verifies."""
    url = f"file://{faulty_disk.mountpoint}/run?direct={direct}"
    ckptio.save(expected_state(1), url, step=1)
    data = f"{faulty_disk.mountpoint}/run/step-0000000001/data/"
    with faulty_disk.faults(["read"], match="/data/"):
        with (
            pytest.warns(errors.DamagedCheckpointWarning, match="skipping step 1"),
            pytest.raises(errors.StorageError) as info,
        ):
            ckptio.load(url)
        assert ckptio.Checkpointer(url).steps() == [1]  # listing still works
    text = str(info.value)
    assert f"cannot read {data}" in text and "Input/output error" in text, text
    assert info.value.errno == errno.EIO
    assert state_mismatch(ckptio.load(url), expected_state(1)) is None
    assert ckptio.verify(url, 1) == []


def test_failed_manifest_publish_leaves_no_data(tmp_path, monkeypatch):
    """The commit itself fails (EIO on the manifest): the data written is removed again."""
    url = f"file://{tmp_path}/run"
    from ckptio.backends.local import LocalStore

    def failing_publish(self, key, data, *, overwrite=True):
        raise errors.StorageError(errno.EIO, f"cannot publish {key}: Input/output error", key)

    monkeypatch.setattr(LocalStore, "publish", failing_publish)
    with pytest.raises(errors.SaveFailedError, match="Input/output error"):
        ckptio.save(expected_state(1), url, step=1)
    monkeypatch.undo()
    with open_store(url) as store:
        assert store.list("step-") == [] and store.list_incomplete("step-") == []


@pytest.mark.fuse
def test_a_write_fault_is_seen_alike_by_save_and_by_ckptio_run(faulty_disk, tmp_path):
    """The library's save and the suite's run write through the same writer (issue 31): the
    kernel's EIO on every write of a data object fails ``ckptio.save`` and ``ckptio run``
    alike, each naming the object under its own root and the error, each committing nothing;
    with the faults off both succeed on the same roots."""
    mount = faulty_disk.mountpoint
    lib, suite = f"file://{mount}/lib", f"file://{mount}/suite"
    run = [sys.executable, "-m", "ckptio.cli", "run", suite, "--total-size", "4MiB"]
    run += ["--object-size", "1MiB", "--no-read", "--out", str(tmp_path / "results")]
    with faulty_disk.faults(["write"], match="/data/"):
        with pytest.raises(errors.SaveFailedError) as saved:
            ckptio.save(expected_state(1), lib, step=1)
        ran = subprocess.run(run, capture_output=True, text=True, timeout=300)
    said = {"ckptio.save": str(saved.value), "ckptio run": ran.stdout + ran.stderr}
    assert ran.returncode != 0, said["ckptio run"]
    for (who, text), root in zip(said.items(), ("lib", "suite"), strict=True):
        assert "nothing committed" in text, (who, text)
        assert f"cannot write {mount}/{root}/step-" in text and "/data/" in text, (who, text)
        assert "Input/output error" in text, (who, text)
    for url in (lib, suite):
        with open_store(url) as store:
            assert [k for k in store.list("step-") if k.endswith("manifest.json")] == [], url
    ckptio.save(expected_state(1), lib, step=1)  # faults off: both work
    assert subprocess.run(run, capture_output=True, text=True, timeout=300).returncode == 0
