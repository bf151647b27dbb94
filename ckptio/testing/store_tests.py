"""The Store conformance suite: every backend must pass it.

Subclass :class:`StoreTests` and provide a ``store`` fixture returning an empty store. The
tests use only the Store API plus, where a backend can offer them, the out-of-band helpers
``raw_keys`` (what really exists, bypassing the store) which subclasses may override.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ckptio import errors
from ckptio.store import Store


class StoreTests:
    """Behaviour every Store must show. Subclasses supply the ``store`` fixture."""

    #: bytes for the multi-part test; subclasses with small part sizes may lower it
    large_size = 9 * 2**20 + 123

    def raw_keys(self, store: Store) -> list[str] | None:
        """Every object under the store's root as the storage itself sees it, including
        debris (temp files, incomplete uploads); None where the subclass cannot tell."""
        return None

    # -- writes and reads -----------------------------------------------------------------
    def test_put_get_roundtrip(self, store: Store) -> None:
        store.put("a/b.bin", b"hello world")
        assert store.get("a/b.bin") == b"hello world"
        assert store.size("a/b.bin") == 11

    def test_writer_takes_many_buffer_kinds(self, store: Store) -> None:
        arr = np.arange(1000, dtype=np.float32)
        with store.open_writer("x.bin") as w:
            w.write(b"abc")
            w.write(memoryview(b"defg"))
            w.write(bytearray(b"h"))
            w.write(arr)
        assert store.get("x.bin") == b"abcdefgh" + arr.tobytes()

    def test_large_object_in_many_parts(self, store: Store) -> None:
        data = np.random.default_rng(1).integers(0, 255, self.large_size, dtype=np.uint8)
        with store.open_writer("big.bin", size_hint=data.nbytes) as w:
            for start in range(0, data.nbytes, 3 * 2**20 + 7):
                w.write(data[start : start + 3 * 2**20 + 7])
        assert store.size("big.bin") == data.nbytes
        back = np.empty_like(data)
        assert store.read_into("big.bin", 0, back) == data.nbytes
        assert np.array_equal(back, data)

    def test_read_into_at_offset(self, store: Store) -> None:
        store.put("r.bin", bytes(range(256)) * 40)
        buf = bytearray(100)
        assert store.read_into("r.bin", 1000, buf) == 100
        assert bytes(buf) == (bytes(range(256)) * 40)[1000:1100]

    def test_read_past_end_is_short(self, store: Store) -> None:
        store.put("s.bin", b"12345")
        buf = bytearray(10)
        assert store.read_into("s.bin", 3, buf) == 2
        assert bytes(buf[:2]) == b"45"

    def test_missing_key_is_not_found(self, store: Store) -> None:
        with pytest.raises(FileNotFoundError):
            store.get("nope.bin")
        with pytest.raises(errors.NotFoundError):
            store.size("nope.bin")
        with pytest.raises(FileNotFoundError):
            store.read_into("nope.bin", 0, bytearray(4))
        assert not store.exists("nope.bin")

    def test_writer_invisible_until_close(self, store: Store) -> None:
        w = store.open_writer("pending.bin")
        w.write(b"x" * 1000)
        assert not store.exists("pending.bin")
        assert "pending.bin" not in store.list("")
        w.close()
        assert store.get("pending.bin") == b"x" * 1000

    def test_abort_leaves_nothing(self, store: Store) -> None:
        w = store.open_writer("gone/aborted.bin")
        w.write(b"y" * 5000)
        w.abort()
        assert not store.exists("gone/aborted.bin")
        assert store.list("") == []
        raw = self.raw_keys(store)
        if raw is not None:
            assert raw == []
        assert store.list_incomplete("") == []

    def test_exception_in_with_aborts(self, store: Store) -> None:
        with pytest.raises(RuntimeError), store.open_writer("boom.bin") as w:
            w.write(b"z" * 100)
            raise RuntimeError("boom")
        assert not store.exists("boom.bin")

    def test_overwrite_replaces_whole_object(self, store: Store) -> None:
        store.put("o.bin", b"first version, long")
        store.put("o.bin", b"second")
        assert store.get("o.bin") == b"second"

    # -- listing and deleting ---------------------------------------------------------------
    def test_list_prefix_sorted(self, store: Store) -> None:
        for k in ["p/2.bin", "p/1.bin", "p/sub/3.bin", "q/4.bin", "pz.bin"]:
            store.put(k, b"1")
        assert store.list("p/") == ["p/1.bin", "p/2.bin", "p/sub/3.bin"]
        assert store.list("p") == ["p/1.bin", "p/2.bin", "p/sub/3.bin", "pz.bin"]
        assert store.list("") == sorted(["p/2.bin", "p/1.bin", "p/sub/3.bin", "q/4.bin", "pz.bin"])
        assert store.list("nothing/") == []

    def test_delete(self, store: Store) -> None:
        store.put("d/1.bin", b"1")
        store.put("d/2.bin", b"2")
        store.delete(["d/1.bin", "d/missing.bin"])
        assert store.list("d/") == ["d/2.bin"]
        store.delete(["d/2.bin"])
        assert store.list("") == []

    # -- the commit primitive ---------------------------------------------------------------
    def test_publish_and_overwrite(self, store: Store) -> None:
        store.publish("m/manifest.json", b'{"v": 1}')
        assert store.get("m/manifest.json") == b'{"v": 1}'
        store.publish("m/manifest.json", b'{"v": 2}', overwrite=True)
        assert store.get("m/manifest.json") == b'{"v": 2}'

    def test_publish_create_if_absent(self, store: Store) -> None:
        store.publish("c/manifest.json", b"winner", overwrite=False)
        with pytest.raises(FileExistsError):
            store.publish("c/manifest.json", b"loser", overwrite=False)
        assert store.get("c/manifest.json") == b"winner"

    def test_concurrent_create_if_absent_one_winner(self, store: Store) -> None:
        if not store.capabilities.conditional_create:
            pytest.skip(f"{store.name} has no atomic create-if-absent")
        outcomes: list[str] = []
        lock = threading.Lock()

        def attempt(i: int) -> None:
            try:
                store.publish("race/manifest.json", f"writer {i}".encode(), overwrite=False)
                res = "won"
            except FileExistsError:
                res = "lost"
            with lock:
                outcomes.append(res)

        threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outcomes.count("won") == 1
        assert store.get("race/manifest.json").startswith(b"writer ")

    # -- keys and tracing -------------------------------------------------------------------
    @pytest.mark.parametrize("bad", ["../x", "/abs", "a/../b", "a//b", "", "a/./b", "sp ace"])
    def test_unsafe_keys_refused(self, store: Store, bad: str) -> None:
        with pytest.raises(errors.InvalidArgumentError):
            store.put(bad, b"1")
        with pytest.raises(errors.InvalidArgumentError):
            store.read_into(bad, 0, bytearray(1))

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
