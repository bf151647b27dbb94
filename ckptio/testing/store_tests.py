"""The Store conformance suite: what every backend must do, checked from outside the store.

A backend (ckptio's own or a third party's) passes it by subclassing :class:`StoreTests` in a
test module, following zarr-python's ``zarr.testing.store.StoreTests``. The subclass provides:

- a ``store`` fixture returning a fresh, empty store (closed by the fixture, if it needs to be);
- the out-of-band helpers, **required**: :meth:`~StoreTests.raw_get`,
  :meth:`~StoreTests.raw_put` and :meth:`~StoreTests.raw_list`. They go *around* the store
  (the filesystem, the object store's own client, the dictionary), so that every write the
  store makes is checked in the storage itself and every read is fed with data the store did
  not write. Keys are relative to the store's root, as the Store API takes them. A subclass
  that lacks one of them is refused when its class is defined.

And, where the backend can offer them, optional hooks that switch on more tests:

- :meth:`~StoreTests.raw_incomplete`: the debris of interrupted writes the storage holds (the
  default derives it from :meth:`raw_list`: what the storage has and the store does not list);
- :meth:`~StoreTests.leave_debris`: leave, out of band, what a writer killed mid-object leaves
  (a temp file, an open multipart upload), so the cleanup API is tested on real debris;
- :meth:`~StoreTests.faults` with :attr:`~StoreTests.fault_kinds`: a store on the same storage
  whose next requests fail as the storage fails (``throttle``, ``transient``, ``denied``), for
  the retry and error tests. For an HTTP service, :class:`ckptio.testing.faults.FaultProxy`
  in front of the endpoint does it (see :class:`S3RawAccess`).

Capability-gated tests skip, with the reason, where :class:`~ckptio.store.Capabilities` (or
``fork_safe``) says the store cannot: positional writes, concurrent create-if-absent,
``after_fork`` in a real forked child. The rest applies to every store.

Ready-made out-of-band access for two common kinds of storage: :class:`DirectoryRawAccess` (a
store whose objects are files under a directory) and :class:`S3RawAccess` (an S3-compatible
bucket, through boto3). A minimal subclass::

    import pytest
    from ckptio.testing.store_tests import DirectoryRawAccess, StoreTests

    class TestMyStore(DirectoryRawAccess, StoreTests):
        @pytest.fixture
        def store(self, tmp_path):
            self.raw_root = str(tmp_path / "root")
            return MyStore(f"myfs://{tmp_path}/root")
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np
import pytest

from ckptio import errors
from ckptio.store import RetryPolicy, Store

REQUIRED = ("raw_get", "raw_put", "raw_list")
"""The out-of-band helpers every concrete test class must implement."""

FAULT_KINDS = ("throttle", "transient", "denied")
"""What :meth:`StoreTests.faults` can be asked for: the storage asks the client to slow down
(S3 503 SlowDown), fails in a way worth retrying (500, a reset connection), or refuses the
request for good (403 AccessDenied)."""

FAST_RETRIES = RetryPolicy(max_attempts=4, base_delay=0.005, max_delay=0.02)
"""The retry policy of the stores :meth:`StoreTests.faults` yields: few, short backoffs."""

__all__ = ["StoreTests"]


class StoreTests:
    """Behaviour every Store must show. Subclasses supply the ``store`` fixture and the
    out-of-band helpers (see the module docstring)."""

    #: bytes for the multi-part test; subclasses with small part sizes may lower it
    large_size = 9 * 2**20 + 123
    #: fault kinds :meth:`faults` can inject for this backend (subset of FAULT_KINDS)
    fault_kinds: ClassVar[tuple[str, ...]] = ()
    #: the storage tells the age of debris (``cleanup_incomplete(older_than=...)`` is tested);
    #: False where it does not (moto reports every upload as initiated in 2010)
    debris_has_age = True
    #: seconds the forked child of the after_fork test may take before it counts as hung
    fork_timeout = 60.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__name__.startswith("Test"):  # a class pytest collects: must be complete
            missing = [m for m in REQUIRED if getattr(cls, m) is getattr(StoreTests, m)]
            if missing:
                raise TypeError(
                    f"{cls.__qualname__} must implement the out-of-band helpers "
                    f"{', '.join(missing)} (see ckptio.testing.store_tests)"
                )
        unknown = set(cls.fault_kinds) - set(FAULT_KINDS)
        if unknown:
            raise TypeError(f"{cls.__qualname__}.fault_kinds: unknown {sorted(unknown)}")

    # -- out of band: required ------------------------------------------------------------
    def raw_get(self, store: Store, key: str) -> bytes:
        """The bytes stored under ``key``, read around the store; raises
        :class:`FileNotFoundError` (or a subclass) where there is no such object."""
        raise NotImplementedError

    def raw_put(self, store: Store, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` around the store (as another writer would)."""
        raise NotImplementedError

    def raw_list(self, store: Store, prefix: str = "") -> set[str]:
        """Every key under ``prefix`` as the storage holds it, debris included (a temp file's
        name, for example): what really exists, not what the store chooses to show."""
        raise NotImplementedError

    # -- out of band: optional ------------------------------------------------------------
    def raw_incomplete(self, store: Store, prefix: str = "") -> set[str]:
        """Debris of interrupted writes under ``prefix`` as the storage holds it. Default:
        what :meth:`raw_list` finds and the store does not list (temp files)."""
        return self.raw_list(store, prefix) - set(store.list(prefix))

    def leave_debris(self, store: Store, key: str) -> bool:
        """Leave, around the store, what a writer of ``key`` killed mid-object leaves in this
        storage; False where a killed writer leaves nothing (the default)."""
        return False

    @contextlib.contextmanager
    def faults(self, store: Store, kind: str, count: int | None) -> Iterator[Store]:
        """Yield a store on the same storage as ``store`` whose next ``count`` requests
        (``None``: every one) fail with ``kind`` (one of :attr:`fault_kinds`), the failure
        coming from where the storage's would: the server, the client library, the wrapped
        store. Its retry policy is :data:`FAST_RETRIES`. Default: no fault hook."""
        pytest.skip(f"{type(self).__name__} has no fault hook")
        yield store

    # -- helpers --------------------------------------------------------------------------
    def _need_faults(self, kind: str) -> None:
        if kind not in self.fault_kinds:
            pytest.skip(f"{type(self).__name__} cannot inject {kind!r} faults (fault_kinds)")

    def assert_absent(self, store: Store, key: str) -> None:
        """``key`` is no object: not through the store, not in the storage."""
        assert not store.exists(key)
        assert key not in store.list("")
        assert key not in self.raw_list(store)
        with pytest.raises(FileNotFoundError):
            self.raw_get(store, key)

    # -- writes, checked in the storage ------------------------------------------------------
    def test_put_is_stored(self, store: Store) -> None:
        store.put("a/b.bin", b"hello world")
        assert self.raw_get(store, "a/b.bin") == b"hello world"
        assert self.raw_list(store) == {"a/b.bin"}
        assert store.size("a/b.bin") == 11

    def test_writer_takes_many_buffer_kinds(self, store: Store) -> None:
        arr = np.arange(1000, dtype=np.float32)
        with store.open_writer("x.bin") as w:
            w.write(b"abc")
            w.write(memoryview(b"defg"))
            w.write(bytearray(b"h"))
            w.write(arr)
            assert w.nbytes == 8 + arr.nbytes
        assert self.raw_get(store, "x.bin") == b"abcdefgh" + arr.tobytes()

    def test_large_object_in_many_parts(self, store: Store) -> None:
        data = np.random.default_rng(1).integers(0, 255, self.large_size, dtype=np.uint8)
        with store.open_writer("big.bin", size_hint=data.nbytes) as w:
            for start in range(0, data.nbytes, 3 * 2**20 + 7):
                w.write(data[start : start + 3 * 2**20 + 7])
        assert self.raw_get(store, "big.bin") == data.tobytes()
        assert store.size("big.bin") == data.nbytes

    def test_empty_object(self, store: Store) -> None:
        with store.open_writer("e/empty.bin"):
            pass
        assert self.raw_get(store, "e/empty.bin") == b""
        assert store.size("e/empty.bin") == 0 and store.list("e/") == ["e/empty.bin"]

    def test_writer_invisible_until_close(self, store: Store) -> None:
        w = store.open_writer("pending.bin")
        w.write(b"x" * 1000)
        assert not store.exists("pending.bin")
        assert "pending.bin" not in store.list("")
        assert "pending.bin" not in self.raw_list(store)
        w.close()
        assert self.raw_get(store, "pending.bin") == b"x" * 1000

    def test_abort_leaves_nothing(self, store: Store) -> None:
        w = store.open_writer("gone/aborted.bin")
        w.write(b"y" * 5000)
        w.abort()
        w.abort()  # idempotent
        self.assert_absent(store, "gone/aborted.bin")
        assert self.raw_list(store) == set()
        assert self.raw_incomplete(store) == set()
        assert store.list_incomplete("") == []

    def test_abort_of_a_large_object_leaves_nothing(self, store: Store) -> None:
        data = np.ones(self.large_size, dtype=np.uint8)
        w = store.open_writer("gone/big.bin", size_hint=data.nbytes)
        w.write(data)
        w.abort()
        self.assert_absent(store, "gone/big.bin")
        assert self.raw_incomplete(store) == set()
        assert store.list_incomplete("") == []

    def test_exception_in_with_aborts(self, store: Store) -> None:
        with pytest.raises(RuntimeError), store.open_writer("boom.bin") as w:
            w.write(b"z" * 100)
            raise RuntimeError("boom")
        self.assert_absent(store, "boom.bin")

    def test_write_after_close_is_refused(self, store: Store) -> None:
        w = store.open_writer("closed.bin")
        w.write(b"1")
        w.close()
        with pytest.raises(errors.InvalidArgumentError):
            w.write(b"2")
        assert self.raw_get(store, "closed.bin") == b"1"

    def test_overwrite_replaces_whole_object(self, store: Store) -> None:
        self.raw_put(store, "o.bin", b"first version, long")
        store.put("o.bin", b"second")
        assert self.raw_get(store, "o.bin") == b"second"

    # -- reads, fed out of band --------------------------------------------------------------
    def test_get_reads_what_the_storage_holds(self, store: Store) -> None:
        self.raw_put(store, "in/a.bin", b"written around the store")
        assert store.get("in/a.bin") == b"written around the store"
        assert store.size("in/a.bin") == 24 and store.exists("in/a.bin")

    def test_read_into_at_offset(self, store: Store) -> None:
        data = bytes(range(256)) * 40
        self.raw_put(store, "r.bin", data)
        buf = bytearray(100)
        assert store.read_into("r.bin", 1000, buf) == 100
        assert bytes(buf) == data[1000:1100]
        arr = np.zeros(64, dtype=np.uint8)  # any writable buffer
        assert store.read_into("r.bin", 0, arr) == 64 and arr.tobytes() == data[:64]

    def test_stored_ranges_of_a_written_object_leave_no_hole(self, store: Store) -> None:
        """What was written is stored: ``stored_ranges`` reports every byte of it, of the
        whole object and of a part (however it splits the ranges)."""
        data = bytes(range(256)) * 64
        self.raw_put(store, "s.bin", data)
        for lo, hi in ((0, len(data)), (100, 200)):
            ranges = list(store.stored_ranges("s.bin", lo, hi))
            pos = lo
            for start, end in ranges:
                assert start == pos < end, ranges
                pos = end
            assert pos == hi, ranges

    def test_read_large_object(self, store: Store) -> None:
        data = np.random.default_rng(2).integers(0, 255, self.large_size, dtype=np.uint8)
        self.raw_put(store, "big-in.bin", data.tobytes())
        back = np.empty_like(data)
        assert store.read_into("big-in.bin", 0, back) == data.nbytes
        assert np.array_equal(back, data)

    def test_read_past_end_is_short(self, store: Store) -> None:
        self.raw_put(store, "s.bin", b"12345")
        buf = bytearray(10)
        assert store.read_into("s.bin", 3, buf) == 2
        assert bytes(buf[:2]) == b"45"
        assert store.read_into("s.bin", 5, bytearray(4)) == 0

    def test_negative_offset_is_refused(self, store: Store) -> None:
        self.raw_put(store, "neg.bin", b"12345")
        with pytest.raises(errors.InvalidArgumentError):
            store.read_into("neg.bin", -1, bytearray(2))

    def test_missing_key_is_not_found(self, store: Store) -> None:
        self.raw_put(store, "there.bin", b"1")
        with pytest.raises(FileNotFoundError):
            store.get("nope.bin")
        with pytest.raises(errors.NotFoundError):
            store.size("nope.bin")
        with pytest.raises(errors.NotFoundError):
            store.read_into("nope.bin", 0, bytearray(4))
        assert not store.exists("nope.bin")

    def test_stat_reports_the_size_and_the_storages_write_time(self, store: Store) -> None:
        """``stat`` is one HEAD: the size, and the write time the storage stamped (leases are
        judged by it, :mod:`ckptio.lease`), or None where the backend cannot tell. The
        storages these tests start run on this machine, so the stamp is near its clock."""
        before = time.time()
        self.raw_put(store, "t/stat.bin", b"12345")
        after = time.time()
        st = store.stat("t/stat.bin")
        assert st.size == 5
        if st.modified is not None:  # S3 stamps whole seconds; a filesystem's clock is coarse
            assert before - 2 <= st.modified <= after + 2, (before, st.modified, after)
        with pytest.raises(errors.NotFoundError):
            store.stat("t/nope.bin")

    # -- listing and deleting ---------------------------------------------------------------
    def test_list_prefix_sorted(self, store: Store) -> None:
        keys = ["p/2.bin", "p/1.bin", "p/sub/3.bin", "q/4.bin", "pz.bin"]
        for k in keys:
            self.raw_put(store, k, b"1")
        assert store.list("p/") == ["p/1.bin", "p/2.bin", "p/sub/3.bin"]
        assert store.list("p") == ["p/1.bin", "p/2.bin", "p/sub/3.bin", "pz.bin"]
        assert store.list("") == sorted(keys)
        assert store.list("nothing/") == []

    def test_delete(self, store: Store) -> None:
        self.raw_put(store, "d/1.bin", b"1")
        self.raw_put(store, "d/2.bin", b"2")
        store.delete(["d/1.bin", "d/missing.bin"])
        assert self.raw_list(store) == {"d/2.bin"}
        store.delete(["d/2.bin"])
        assert self.raw_list(store) == set()
        store.delete([])

    # -- the commit primitive ---------------------------------------------------------------
    def test_publish_and_overwrite(self, store: Store) -> None:
        store.publish("m/manifest.json", b'{"v": 1}')
        assert self.raw_get(store, "m/manifest.json") == b'{"v": 1}'
        store.publish("m/manifest.json", b'{"v": 2}', overwrite=True)
        assert self.raw_get(store, "m/manifest.json") == b'{"v": 2}'
        assert self.raw_list(store) == {"m/manifest.json"}

    def test_publish_create_if_absent(self, store: Store) -> None:
        store.publish("c/manifest.json", b"winner", overwrite=False)
        with pytest.raises(FileExistsError):
            store.publish("c/manifest.json", b"loser", overwrite=False)
        assert self.raw_get(store, "c/manifest.json") == b"winner"

    def test_create_if_absent_sees_another_writers_object(self, store: Store) -> None:
        self.raw_put(store, "c2/manifest.json", b"other writer")
        with pytest.raises(errors.AlreadyExistsError):
            store.publish("c2/manifest.json", b"mine", overwrite=False)
        assert self.raw_get(store, "c2/manifest.json") == b"other writer"

    def test_concurrent_create_if_absent_one_winner(self, store: Store) -> None:
        if not store.capabilities.conditional_create:
            pytest.skip(f"{store.name} has no atomic create-if-absent (conditional_create)")
        outcomes: list[str] = []
        lock = threading.Lock()
        start = threading.Barrier(8)

        def attempt(i: int) -> None:
            start.wait()
            try:
                store.publish("race/manifest.json", f"writer {i}".encode(), overwrite=False)
                res = f"won {i}"
            except FileExistsError:
                res = "lost"
            with lock:
                outcomes.append(res)

        threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        won = [o for o in outcomes if o.startswith("won")]
        assert len(won) == 1 and len(outcomes) == 8, outcomes
        assert self.raw_get(store, "race/manifest.json") == f"writer {won[0][4:]}".encode()

    # -- positional writes (the shared-file layout) -------------------------------------------
    def test_positional_writes_from_several_writers(self, store: Store) -> None:
        if not store.capabilities.positional_writes:
            pytest.skip(f"{store.name} has no positional writes")
        align = store.positional_alignment
        part = max(align, 2**20)
        rng = np.random.default_rng(3)
        ranges = [
            (i * 2 * part, rng.integers(0, 255, part + 100, dtype=np.uint8)) for i in range(3)
        ]
        size = 6 * part
        store.open_positional("shared.bin", size, create=True).close()
        assert store.size("shared.bin") == size  # visible at full size from its creation
        writers = [store.open_positional("shared.bin", size) for _ in ranges]
        for w, (start, data) in zip(writers, ranges, strict=True):
            w.pwrite(start, data)
        for w in writers:
            w.close()
        stored = self.raw_get(store, "shared.bin")
        assert len(stored) == size
        for start, data in ranges:
            assert stored[start : start + data.nbytes] == data.tobytes()

    def test_positional_open_of_a_missing_object_is_not_found(self, store: Store) -> None:
        if not store.capabilities.positional_writes:
            pytest.skip(f"{store.name} has no positional writes")
        with pytest.raises(errors.NotFoundError):
            store.open_positional("nope.bin", 4096)

    def test_positional_writes_refused_without_the_capability(self, store: Store) -> None:
        if store.capabilities.positional_writes:
            pytest.skip(f"{store.name} has positional writes")
        with pytest.raises(errors.InvalidArgumentError):
            store.open_positional("shared.bin", 4096, create=True)
        assert self.raw_list(store) == set()

    # -- interrupted writers and their debris ---------------------------------------------------
    def test_abandoned_writer_is_invisible_and_cleanup_removes_its_debris(
        self, store: Store
    ) -> None:
        """A writer left as a killed process leaves it (neither closed nor aborted): no object
        appears; whatever debris it left is listed, kept while younger than ``older_than``,
        and removed by ``cleanup_incomplete``."""
        w = store.open_writer("crash/obj.bin", size_hint=2**20)
        w.write(np.ones(2**20, dtype=np.uint8))  # a local write may still be landing below
        try:
            self.assert_absent(store, "crash/obj.bin")
            debris = [*store.list_incomplete("crash/")]
            assert bool(debris) == bool(self.raw_incomplete(store, "crash/")), debris
            if self.debris_has_age:
                assert store.cleanup_incomplete("crash/", older_than=3600) == 0
                assert store.list_incomplete("crash/") == debris
            assert store.cleanup_incomplete("crash/") == len(debris)
            assert store.list_incomplete("crash/") == []
            assert self.raw_incomplete(store, "crash/") == set()
            assert self.raw_list(store, "crash/") == set()
        finally:
            with contextlib.suppress(errors.CkptioError):
                w.abort()  # release the writer's resources (its debris is gone already)
        self.assert_absent(store, "crash/obj.bin")

    def test_debris_of_a_killed_writer_is_found_and_removed(self, store: Store) -> None:
        self.raw_put(store, "step/done.bin", b"committed")
        if not self.leave_debris(store, "step/obj.bin"):
            pytest.skip(f"{type(self).__name__}: a killed writer leaves no debris here")
        self.assert_absent(store, "step/obj.bin")
        assert store.list("step/") == ["step/done.bin"]
        raw = self.raw_incomplete(store, "step/")
        debris = [*store.list_incomplete("step/")]
        assert raw and len(debris) == len(raw), (debris, raw)
        assert store.list_incomplete("other/") == []
        if self.debris_has_age:
            assert store.cleanup_incomplete("step/", older_than=3600) == 0  # too young: kept
            assert self.raw_incomplete(store, "step/") == raw
        assert store.cleanup_incomplete("step/") == len(debris)
        assert self.raw_incomplete(store, "step/") == set()
        assert store.list_incomplete("step/") == []
        assert self.raw_list(store) == {"step/done.bin"}  # committed objects untouched
        assert self.raw_get(store, "step/done.bin") == b"committed"

    # -- retries and errors, through the fault hook ---------------------------------------------
    def test_throttled_writes_are_retried_and_succeed(self, store: Store) -> None:
        self._need_faults("throttle")
        with self.faults(store, "throttle", 2) as st:
            st.publish("f/m.json", b"throttled twice")
            outcomes = [e.outcome for e in st.trace.events()]
        assert self.raw_get(store, "f/m.json") == b"throttled twice"
        assert [o for o in outcomes if o != "ok"] == ["throttled", "throttled"], outcomes

    def test_throttled_reads_are_retried_and_succeed(self, store: Store) -> None:
        self._need_faults("throttle")
        self.raw_put(store, "f/in.bin", b"read through throttling")
        with self.faults(store, "throttle", 1) as st:
            assert st.get("f/in.bin") == b"read through throttling"
            events = [(e.op, e.outcome, e.error) for e in st.trace.events()]
        assert [o for _, o, _ in events if o != "ok"] == ["throttled"], events

    def test_transient_failures_are_retried_and_succeed(self, store: Store) -> None:
        self._need_faults("transient")
        data = np.arange(2**18, dtype=np.float32)
        with self.faults(store, "transient", 2) as st:
            st.put("f/t.bin", data)
            retried = [e for e in st.trace.events() if e.outcome == "retry"]
        assert len(retried) == 2, retried
        assert self.raw_get(store, "f/t.bin") == data.tobytes()
        assert store.list_incomplete("") == [] and self.raw_incomplete(store) == set()

    def test_persistent_failures_exhaust_the_retry_budget(self, store: Store) -> None:
        self._need_faults("transient")
        with self.faults(store, "transient", None) as st:
            with pytest.raises(errors.RetryBudgetExceededError) as info:
                st.publish("f/never.json", b"x")
            attempts = [e.attempt for e in st.trace.events() if e.key == "f/never.json"]
            budget = st.retry_policy.max_attempts
        assert isinstance(info.value, errors.StorageError)
        assert "f/never.json" in str(info.value) and f"failed {budget} times" in str(info.value)
        assert attempts == list(range(1, budget + 1))
        self.assert_absent(store, "f/never.json")

    def test_permanent_error_is_not_retried(self, store: Store) -> None:
        self._need_faults("denied")
        with self.faults(store, "denied", 1) as st:
            with pytest.raises(errors.StoragePermissionError) as info:
                st.publish("f/denied.json", b"x")
            attempts = [e.attempt for e in st.trace.events() if e.key == "f/denied.json"]
        assert isinstance(info.value, PermissionError)
        assert not isinstance(info.value, errors.TransientStorageError)
        assert attempts == [1]
        self.assert_absent(store, "f/denied.json")

    # -- fork -----------------------------------------------------------------------------------
    def test_store_works_in_a_forked_child(self, store: Store) -> None:
        if not store.fork_safe:
            pytest.skip(f"{store.name} is not fork-safe (fork_safe)")
        data = np.arange(2**20, dtype=np.uint8)  # spans I/O pools where the store has them
        store.put("fork/parent.bin", data)  # the parent's pools and clients are in use
        assert store.get("fork/parent.bin") == data.tobytes()
        parent_events = len(store.trace.events())
        read, write = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12+ warns when a process with threads forks: the child uses only the
            # store, after its after_fork (what the contract asks of it)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: report through the exit status, never return into pytest
            status = 1
            try:
                os.close(read)
                store.after_fork()
                ok = store.get("fork/parent.bin") == data.tobytes()
                store.put("fork/child.bin", data[::-1].copy())
                os.write(write, b"ok" if ok and store.trace.events() else b"bad")
                status = 0
            finally:
                os._exit(status)
        os.close(write)
        with os.fdopen(read, "rb") as fh:
            ready, _, _ = select.select([fh], [], [], self.fork_timeout)
            said = fh.read() if ready else b""
        if not ready:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert ready, (
            f"the forked child did not finish within {self.fork_timeout} s "
            "(after_fork left a thread pool, lock or client unusable?)"
        )
        assert os.waitstatus_to_exitcode(status) == 0 and said == b"ok", (status, said)
        assert self.raw_get(store, "fork/child.bin") == data[::-1].tobytes()
        assert len(store.trace.events()) == parent_events  # the child's requests are its own
        store.put("fork/parent-after.bin", data)  # the parent's store is intact
        assert self.raw_get(store, "fork/parent-after.bin") == data.tobytes()

    # -- keys and tracing -------------------------------------------------------------------
    @pytest.mark.parametrize("bad", ["../x", "/abs", "a/../b", "a//b", "", "a/./b", "sp ace"])
    def test_unsafe_keys_refused(self, store: Store, bad: str) -> None:
        with pytest.raises(errors.InvalidArgumentError):
            store.put(bad, b"1")
        with pytest.raises(errors.InvalidArgumentError):
            store.read_into(bad, 0, bytearray(1))
        assert self.raw_list(store) == set()

    def test_requests_are_traced(self, store: Store) -> None:
        store.trace.clear()
        store.put("t/1.bin", b"a" * 4096)
        store.get("t/1.bin")
        store.list("t/")
        events = store.trace.events()
        ops = {e.op for e in events}
        assert ops & {"write", "put", "commit"}, ops
        assert "get" in ops and "list" in ops
        got = [e for e in events if e.op == "get"]
        assert sum(e.nbytes for e in got) == 4096
        assert all(e.end >= e.start and e.outcome == "ok" for e in events)

    def test_capabilities_declared(self, store: Store) -> None:
        assert store.schemes and store.name
        caps = store.capabilities
        assert isinstance(caps.atomic_rename, bool) and isinstance(caps.listing, bool)


# -- ready-made out-of-band access -------------------------------------------------------------


class DirectoryRawAccess:
    """Out-of-band helpers for a store whose objects are files under a directory: the
    ``store`` fixture sets :attr:`raw_root` to that directory. ``raw_list`` shows every file
    (temp files included); ``leave_debris`` leaves a temp file named as ckptio's local
    backends name theirs (override it for another convention)."""

    raw_root: str
    skip_dirs: ClassVar[tuple[str, ...]] = ()
    """Directory names that belong to the filesystem, not the store (GlusterFS's ``.glusterfs``)."""

    def _path(self, key: str) -> str:
        return os.path.join(self.raw_root, *key.split("/"))

    def raw_get(self, store: Store, key: str) -> bytes:
        with open(self._path(key), "rb") as fh:
            return fh.read()

    def raw_put(self, store: Store, key: str, data: bytes) -> None:
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)

    def raw_list(self, store: Store, prefix: str = "") -> set[str]:
        out = set()
        for d, dirs, files in os.walk(self.raw_root):
            dirs[:] = [x for x in dirs if x not in self.skip_dirs]
            for f in files:
                key = os.path.relpath(os.path.join(d, f), self.raw_root).replace(os.sep, "/")
                if key.startswith(prefix):
                    out.add(key)
        return out

    def open_at(self, root: str) -> Store:
        """A store like the fixture's, rooted at the directory ``root`` (for the fault hook,
        which mounts :attr:`raw_root` elsewhere); a class that lists ``denied`` in
        ``fault_kinds`` provides it."""
        raise NotImplementedError

    @contextlib.contextmanager
    def faults(self, store: Store, kind: str, count: int | None) -> Iterator[Store]:
        """``denied`` only: :attr:`raw_root` mounted through a FUSE filesystem
        (:mod:`ckptio.testing.faultyfs`) that answers every write with ``EACCES``, and a store
        (:meth:`open_at`) on the mount. A filesystem's refusal is not retried, so ``count``
        is a lower bound. Skips where FUSE cannot be mounted (fails under ``CI=true``)."""
        import errno
        import tempfile

        from ckptio.testing import faultyfs

        assert kind == "denied", kind
        point = tempfile.mkdtemp(prefix="ckptio-faultyfs-")
        try:
            fs = faultyfs.start(self.raw_root, point)
        except faultyfs.FaultyFSUnavailable as err:
            os.rmdir(point)
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"FUSE fault filesystem could not be mounted in CI: {err}")
            pytest.skip(f"no FUSE fault filesystem: {err}")
        try:
            st = self.open_at(fs.mountpoint)
            st.retry_policy = FAST_RETRIES
            with fs.faults(["write"], err=errno.EACCES):
                yield st
            st.close()
        finally:
            fs.stop()
            os.rmdir(point)

    def leave_debris(self, store: Store, key: str) -> bool:
        from ckptio.backends.local import TMP_MARK

        directory, _, base = key.rpartition("/")
        tmp = f"{directory}/." if directory else "."
        self.raw_put(store, f"{tmp}{base}{TMP_MARK}{secrets.token_hex(6)}", b"\0" * 8192)
        return True


class S3RawAccess:
    """Out-of-band helpers for a store on an S3 bucket, through a boto3 client: the ``store``
    fixture sets :attr:`raw_client`, :attr:`raw_bucket` and :attr:`raw_prefix` (the store's
    key prefix, without slashes). Debris is open multipart uploads. The fault hook puts a
    :class:`~ckptio.testing.faults.FaultProxy` in front of :attr:`raw_endpoint` and opens a
    store on it with :meth:`open_through` (which the subclass provides)."""

    raw_client: Any
    raw_bucket: str
    raw_prefix: str = ""
    raw_endpoint: str = ""
    fault_kinds: ClassVar[tuple[str, ...]] = ("throttle", "transient", "denied")

    def open_through(self, endpoint: str) -> Store:
        """A store on the same bucket and prefix as the fixture's, with ``endpoint`` as its
        endpoint URL."""
        raise NotImplementedError

    def _full(self, key: str) -> str:
        return f"{self.raw_prefix}/{key}" if self.raw_prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self.raw_prefix) + 1 :] if self.raw_prefix else full

    def raw_get(self, store: Store, key: str) -> bytes:
        client = self.raw_client
        try:
            return client.get_object(Bucket=self.raw_bucket, Key=self._full(key))["Body"].read()
        except client.exceptions.NoSuchKey as err:
            raise FileNotFoundError(key) from err

    def raw_put(self, store: Store, key: str, data: bytes) -> None:
        self.raw_client.put_object(Bucket=self.raw_bucket, Key=self._full(key), Body=data)

    def raw_list(self, store: Store, prefix: str = "") -> set[str]:
        pages = self.raw_client.get_paginator("list_objects_v2").paginate(
            Bucket=self.raw_bucket, Prefix=self._full(prefix)
        )
        return {self._rel(o["Key"]) for page in pages for o in page.get("Contents", ())}

    def raw_incomplete(self, store: Store, prefix: str = "") -> set[str]:
        resp = self.raw_client.list_multipart_uploads(
            Bucket=self.raw_bucket, Prefix=self._full(prefix)
        )
        return {f"{self._rel(u['Key'])}#{u['UploadId']}" for u in resp.get("Uploads", ())}

    def leave_debris(self, store: Store, key: str) -> bool:
        """An open multipart upload with one part uploaded: a writer killed between parts."""
        client, full = self.raw_client, self._full(key)
        upload = client.create_multipart_upload(Bucket=self.raw_bucket, Key=full)["UploadId"]
        client.upload_part(
            Bucket=self.raw_bucket, Key=full, UploadId=upload, PartNumber=1, Body=b"p" * 5 * 2**20
        )
        return True

    @contextlib.contextmanager
    def faults(self, store: Store, kind: str, count: int | None) -> Iterator[Store]:
        """A :class:`~ckptio.testing.faults.FaultProxy` answering the next ``count`` data
        requests (GET, PUT of objects under the prefix; not the janitor's listings) with 503 SlowDown (``throttle``), 500 InternalError
        (``transient``) or 403 AccessDenied (``denied``)."""
        from ckptio.testing.faults import FaultProxy

        proxy_kind = {"throttle": "slowdown", "transient": "internal", "denied": "denied"}[kind]
        with FaultProxy(
            self.raw_endpoint,
            rate=1.0,
            kinds=(proxy_kind,),
            methods=("GET", "PUT"),
            paths=(f"/{self.raw_prefix}/",) if self.raw_prefix else None,
            max_faults=count,
            seed=1,
        ) as proxy:
            st = self.open_through(proxy.url)
            st.retry_policy = FAST_RETRIES
            try:
                yield st
            finally:
                st.close()
            if count is not None:
                assert proxy.stats().get("faults", 0) == count, proxy.stats()


class InnerStoreFaults:
    """A fault hook for a store that wraps another (``store.inner``): the wrapped store's
    requests fail, as the storage below would fail them, and the wrapper's retries answer."""

    fault_kinds: ClassVar[tuple[str, ...]] = ("throttle", "transient", "denied")
    ERRORS: ClassVar[dict[str, Callable[[str], Exception]]] = {
        "throttle": lambda op: errors.ThrottledError(f"injected 503 SlowDown on {op}"),
        "transient": lambda op: errors.TransientStorageError(f"injected 500 on {op}"),
        "denied": lambda op: errors.StoragePermissionError(f"injected AccessDenied on {op}"),
    }
    OPS: ClassVar[tuple[str, ...]] = ("open_writer", "publish", "read_into", "size", "list")

    @contextlib.contextmanager
    def faults(self, store: Store, kind: str, count: int | None) -> Iterator[Store]:
        inner: Store = store.inner  # type: ignore[attr-defined]
        left = [count]
        lock = threading.Lock()
        make = self.ERRORS[kind]

        def failing(op: str, real: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                with lock:
                    fail = left[0] is None or left[0] > 0
                    if fail and left[0] is not None:
                        left[0] -= 1
                if fail:
                    raise make(op)
                return real(*args, **kwargs)

            return call

        saved = {op: getattr(inner, op) for op in self.OPS}
        policy = getattr(store, "retry_policy", None)
        for op, real in saved.items():
            setattr(inner, op, failing(op, real))
        store.retry_policy = FAST_RETRIES
        store.trace.clear()
        try:
            yield store
        finally:
            for op in saved:
                delattr(inner, op)  # the class's methods again
            if policy is None:
                del store.retry_policy
            else:
                store.retry_policy = policy
