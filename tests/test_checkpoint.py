"""The library API on the core backends: round trips, atomicity, corruption, bad manifests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import ckptio
from ckptio import errors
from ckptio import format as fmt
from ckptio.checkpoint import list_steps
from ckptio.cli import main as cli_main


def nested_state(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "model": {
            "w32": rng.standard_normal((64, 33)).astype(np.float32),
            "w16": rng.standard_normal((7, 5)).astype(np.float16),
            "bf16": rng.standard_normal((3, 8)).astype(ml_dtypes.bfloat16),
            "i8": rng.integers(-128, 127, (11,), dtype=np.int8),
            "mask": rng.random(9) > 0.5,
            "scalar0d": np.array(3.25, dtype=np.float64),
            "empty": np.zeros((0, 4), dtype=np.float32),
        },
        "opt": [
            {"m": rng.standard_normal(10), "count": np.int64(7)},
            (np.float32(0.5), np.uint16(3)),
        ],
        "meta": {
            "lr": 3e-4,
            "name": "run/1",
            "tags": ["a", "b"],
            "none": None,
            "flag": True,
            "inf": float("inf"),
        },
        "step": 42,
    }


def assert_same(a, b, path="") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}/{i}")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, np.generic):
        assert type(a) is type(b) and a.tobytes() == b.tobytes(), path
    else:
        assert a == b and type(a) is type(b), path


@pytest.fixture(params=["file", "memory"])
def url(request, tmp_path: Path, memory_url: str) -> str:
    return f"file://{tmp_path}/ckpt" if request.param == "file" else memory_url


def test_roundtrip_every_dtype_and_shape(url: str) -> None:
    state = nested_state()
    ckptio.save(state, url, step=1, metadata={"epoch": 3})
    assert_same(state, ckptio.load(url))
    assert ckptio.open_checkpoint(url).metadata == {"epoch": 3}
    assert ckptio.verify(url) == []


def test_large_tensor_split_into_chunks_and_partial_reads(url: str) -> None:
    big = np.arange(300_000, dtype=np.float64).reshape(1000, 300)
    ckptio.save({"big": big}, url, step=5, chunk_size=100_000)
    reader = ckptio.open_checkpoint(url)
    assert len(reader.manifest.tensors["big"].chunks) > 20
    assert all(c.offset % fmt.ALIGNMENT == 0 for c in reader.manifest.tensors["big"].chunks)
    assert np.array_equal(reader.read("big", np.s_[123:456, 7:9]), big[123:456, 7:9])
    assert np.array_equal(reader.read("big", np.s_[999]), big[999])
    assert np.array_equal(ckptio.load(url, select={"big": np.s_[10:20]})["big"], big[10:20])


def test_load_into_fills_the_callers_arrays_in_place(url: str) -> None:
    state = nested_state()
    state["big"] = np.random.default_rng(1).standard_normal((1024, 520))  # 4 MiB in 5 chunks
    ckptio.save(state, url, step=1, chunk_size=1 << 20)
    raw = np.zeros(1024 * 520 + 1)
    into = {
        "big": raw[1:].reshape(1024, 520),  # 8 bytes past numpy's start: never on a page
        "model": {
            "w32": np.zeros((33, 64), np.float32).T,  # strided: read, then copied in
            "bf16": np.zeros((3, 8), ml_dtypes.bfloat16),
            "scalar0d": np.zeros((), np.float64),
            "empty": np.zeros((0, 4), np.float32),
        },
        "opt": [{"m": np.zeros(10)}],
    }
    got = ckptio.load(url, into=into)
    assert got["big"] is into["big"] and got["opt"][0]["m"] is into["opt"][0]["m"]
    assert all(got["model"][k] is v for k, v in into["model"].items())
    assert_same(state, got)  # what into= lacks comes back new, as from a plain load
    # a box of a tensor into an array of the box's shape
    row = np.zeros(520)
    assert ckptio.load(url, select={"big": np.s_[7]}, into={"big": row})["big"] is row
    assert np.array_equal(row, state["big"][7])
    with ckptio.Checkpointer(url) as ck:
        m = np.zeros(10)
        assert ck.load(into={"opt": [{"m": m}]})["opt"][0]["m"] is m
        assert np.array_equal(m, state["opt"][0]["m"])
    # a rank's shard: the box it names, as saved from Shard leaves
    lower = ckptio.Shard(np.zeros((512, 520)), global_shape=(1024, 520), offsets=(512, 0))
    assert ckptio.load(url, into={"big": lower})["big"] is lower
    assert np.array_equal(lower.array, state["big"][512:])
    bad = ckptio.Shard(np.zeros((512, 520)), global_shape=(1024, 520), offsets=(600, 0))
    with pytest.raises(errors.InvalidArgumentError, match=r"at offsets \(600, 0\) does not fit"):
        ckptio.load(url, into={"big": bad})


def test_load_into_refuses_arrays_that_do_not_fit_before_reading(url: str) -> None:
    ckptio.save({"a": np.arange(6.0), "b": np.ones((2, 3), np.float32)}, url, step=1)
    read_only = np.zeros((2, 3), np.float32)
    read_only.flags.writeable = False
    cases = [
        (
            {"b": np.zeros((3, 2), np.float32)},
            errors.InvalidArgumentError,
            r"into= at 'b' is float32 \(3, 2\); step 1 holds float32 \(2, 3\)",
        ),
        ({"b": np.zeros((2, 3), np.float64)}, errors.InvalidArgumentError, r"'b' is float64"),
        ({"c": np.zeros(2)}, errors.NotFoundError, r"array at 'c', but step 1 has no tensor 'c'"),
        ({"b": read_only}, errors.InvalidArgumentError, r"'b': a read-only numpy array"),
    ]
    for bad, error, message in cases:
        keep = np.zeros(6)
        with pytest.raises(error, match=message):
            ckptio.load(url, into={"a": keep, **bad})
        assert not keep.any()  # refused before anything was read


def test_newest_complete_checkpoint_and_steps(url: str) -> None:
    with ckptio.Checkpointer(url) as ck:
        assert ck.latest() is None
        for step in (10, 20, 30):
            ck.save({"x": np.full(4, step)}, step=step)
        assert ck.steps() == [10, 20, 30]
        assert ck.latest() == 30
        assert int(ck.load()["x"][0]) == 30
        assert int(ck.load(20)["x"][0]) == 20


def test_keep_last_retention(url: str) -> None:
    with ckptio.Checkpointer(url, keep_last=2) as ck:
        for step in range(1, 6):
            ck.save({"x": np.full(4, step)}, step=step)
        assert ck.steps() == [4, 5]
    store = ckptio.open_store(url)
    # retired steps keep their data for readers for the grace period, then gc removes it
    assert {fmt.parse_step_dir(k.partition("/")[0]) for k in store.list("")} == {1, 2, 3, 4, 5}
    ckptio.collect_garbage(store, grace=0)
    assert all(k.startswith(("step-0000000004/", "step-0000000005/")) for k in store.list(""))


def test_saving_a_committed_step_again_is_refused(url: str) -> None:
    ckptio.save({"x": np.zeros(3)}, url, step=1)
    before = sorted(ckptio.open_store(url).list(""))
    with pytest.raises(errors.SaveFailedError, match="already has a committed checkpoint"):
        ckptio.save({"x": np.ones(3)}, url, step=1)
    assert np.array_equal(ckptio.load(url)["x"], np.zeros(3))
    assert sorted(ckptio.open_store(url).list("")) == before  # its lease is gone


def test_a_save_asks_whether_its_step_exists_while_it_publishes_its_lease(tmp_path) -> None:
    """On an object store each is a round trip before the first byte: they overlap (here on
    emulated cloud S3, 100 ms each; a HEAD that finds nothing takes its round trip too)."""
    store = ckptio.open_store(f"emulate+file://{tmp_path}?profile=cloud-s3")
    ckptio.save({"x": np.zeros(3)}, store, step=1)
    head = next(e for e in store.trace.events() if e.op == "head")
    lease = next(e for e in store.trace.events() if e.op == "put" and "saving-" in e.key)
    assert head.end - head.start >= 0.09 and lease.end - lease.start >= 0.09
    assert lease.start < head.end and head.start < lease.end
    store.close()


def test_async_save_snapshots_state(url: str) -> None:
    arr = np.zeros(100_000, dtype=np.float32)
    with ckptio.Checkpointer(url, async_save=True) as ck:
        handle = ck.save({"a": arr}, step=1)
        arr += 1  # an update after save returned must not reach the checkpoint
        result = handle.wait()
        assert handle.blocking_seconds >= 0 and result.step == 1
    assert np.array_equal(ckptio.load(url)["a"], np.zeros(100_000, dtype=np.float32))


def test_failed_save_leaves_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"file://{tmp_path}/ckpt"
    ckptio.save(nested_state(1), url, step=1)
    from ckptio.backends import local

    real = local.LocalWriter._pwrite
    calls = {"n": 0}

    def flaky(self, fd, view, offset):
        calls["n"] += 1
        if calls["n"] == 2:
            raise errors.NoSpaceError(28, "injected: no space left", self._path)
        return real(self, fd, view, offset)

    monkeypatch.setattr(local.LocalWriter, "_pwrite", flaky)
    with pytest.raises(errors.SaveFailedError, match="no space"):
        ckptio.save({"big": np.ones((4096, 1024))}, url, step=2, chunk_size=2**20)
    monkeypatch.undo()
    assert_same(nested_state(1), ckptio.load(url))
    steps = {s.step: s for s in list_steps(ckptio.open_store(url))}
    assert (steps[1].complete and 2 not in steps) or not steps[2].complete


def test_killed_save_leaves_previous_checkpoint(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/ckpt"
    ckptio.save({"x": np.arange(10)}, url, step=1)
    # a child that starts a large save and is killed (SIGKILL) while writing
    script = textwrap.dedent(
        f"""
        import os, signal, threading, numpy as np, ckptio
        from ckptio.backends import local
        real = local.LocalWriter._pwrite
        n = {{"n": 0}}
        def slow(self, fd, view, offset):
            n["n"] += 1
            if n["n"] == 3:
                os.kill(os.getpid(), signal.SIGKILL)   # die in the middle of the data
            return real(self, fd, view, offset)
        local.LocalWriter._pwrite = slow
        ckptio.save({{"x": np.ones((2048, 1024))}}, {url!r}, step=2, block_size="1MiB")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()
    assert np.array_equal(ckptio.load(url)["x"], np.arange(10))
    store = ckptio.open_store(url)
    assert store.list_incomplete("") or store.list("step-0000000002/") == []
    # gc removes the debris and never the committed checkpoint
    ckptio.collect_garbage(store)
    assert store.list_incomplete("") == []
    assert [s.step for s in list_steps(store)] == [1]
    assert ckptio.verify(url) == []


def _data_object(root: Path, step: int) -> Path:
    files = sorted((root / fmt.step_dir(step) / "data").rglob("*.bin"))
    assert files
    return files[0]


def test_flipped_byte_is_detected_by_load_and_verify(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    ckptio.save(nested_state(), f"file://{root}", step=3)
    obj = _data_object(root, 3)
    data = bytearray(obj.read_bytes())
    data[100] ^= 0x01
    obj.write_bytes(bytes(data))
    # the only step is damaged: load warns that it skips it, then raises (nothing older loads)
    with (
        pytest.warns(errors.DamagedCheckpointWarning, match="skipping step 3"),
        pytest.raises(errors.ChecksumError, match=obj.name),
    ):
        ckptio.load(f"file://{root}")
    with pytest.raises(errors.ChecksumError, match=obj.name):
        ckptio.load(f"file://{root}", step=3)
    problems = ckptio.verify(f"file://{root}")
    assert problems and obj.name in problems[0]
    assert cli_main(["verify", f"file://{root}"]) == 1


def test_load_into_a_damaged_checkpoint_raises(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    state = nested_state()
    ckptio.save(state, f"file://{root}", step=3)
    obj = _data_object(root, 3)
    data = bytearray(obj.read_bytes())
    data[100] ^= 0x01
    obj.write_bytes(bytes(data))
    into = {"model": {"w32": np.zeros((64, 33), np.float32)}}
    with (
        pytest.warns(errors.DamagedCheckpointWarning),
        pytest.raises(errors.ChecksumError, match=obj.name),
    ):
        ckptio.load(f"file://{root}", into=into)


def test_truncated_object_is_detected(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    ckptio.save({"a": np.ones(100_000)}, f"file://{root}", step=3)
    obj = _data_object(root, 3)
    with open(obj, "r+b") as f:
        f.truncate(1000)
    with (
        pytest.warns(errors.DamagedCheckpointWarning),
        pytest.raises(errors.CorruptCheckpointError, match="truncated"),
    ):
        ckptio.load(f"file://{root}")
    assert any("bytes" in p for p in ckptio.verify(f"file://{root}"))


# -- bad manifests ------------------------------------------------------------------------------


def _rewrite_manifest(root: Path, step: int, edit) -> None:
    path = root / fmt.manifest_key(step)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _first_chunk(doc: dict) -> dict:
    return next(iter(doc["tensors"].values()))["chunks"][0]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: _first_chunk(d).update(key="data/../../../etc/passwd"), "key"),
        (lambda d: _first_chunk(d).update(key="/etc/passwd"), "key"),
        (lambda d: _first_chunk(d).update(offset=10**9), "offset"),
        (lambda d: _first_chunk(d).update(length=_first_chunk(d)["length"] + 8), "length"),
        (lambda d: next(iter(d["tensors"].values())).update(dtype="object"), "dtype"),
        (lambda d: next(iter(d["tensors"].values())).update(shape=[10**12, 10**12]), "shape"),
        (lambda d: _first_chunk(d).update(shape=[1]), "shape"),
        (lambda d: d.update(version=99), "version"),
        (lambda d: d["objects"].update({"../outside.bin": 10}), "objects"),
    ],
    ids=[
        "traversal",
        "absolute",
        "offset-past-end",
        "length",
        "dtype",
        "absurd-size",
        "shape",
        "version",
        "object-key",
    ],
)
def test_bad_manifest_refused_naming_the_field(tmp_path: Path, edit, field: str) -> None:
    root = tmp_path / "ckpt"
    ckptio.save({"w": np.ones((8, 8), dtype=np.float32)}, f"file://{root}", step=1)
    _rewrite_manifest(root, 1, edit)
    with pytest.raises(errors.ManifestError, match=field) as info:
        ckptio.load(f"file://{root}", step=1)
    assert info.value.field is None or field in str(info.value)


def test_latest_skips_an_invalid_manifest(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "ckpt"
    ckptio.save({"x": np.zeros(2)}, f"file://{root}", step=1)
    ckptio.save({"x": np.ones(2)}, f"file://{root}", step=2)
    (root / fmt.manifest_key(2)).write_bytes(b"\xff\xfe not json")
    assert np.array_equal(ckptio.load(f"file://{root}")["x"], np.zeros(2))
    assert "skipping step 2" in caplog.text
    with pytest.raises(errors.ManifestError, match="UTF-8"):
        ckptio.load(f"file://{root}", step=2)


def test_unknown_scheme_and_bad_input() -> None:
    with pytest.raises(errors.UnknownSchemeError, match="installed schemes"):
        ckptio.load("nosuch://x")
    with pytest.raises(errors.InvalidArgumentError, match="step"):
        ckptio.save({"x": np.zeros(1)}, "memory://bad", step=-1)
    with pytest.raises(errors.InvalidArgumentError, match="cannot checkpoint set"):
        ckptio.save({"x": {1, 2}}, "memory://bad", step=1)
    with pytest.raises(errors.InvalidArgumentError, match="keys must be strings"):
        ckptio.save({1: np.zeros(1)}, "memory://bad", step=1)
    with pytest.raises(errors.InvalidArgumentError, match="unknown layout"):
        ckptio.Checkpointer("memory://bad", layout="nope")
    with pytest.raises(errors.InvalidArgumentError, match="unknown option"):
        ckptio.open_store("file:///tmp/x?bogus=1")


def test_cli_ls_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"file://{tmp_path}/ckpt"
    ckptio.save({"x": np.zeros(1000)}, url, step=7)
    os.makedirs(tmp_path / "ckpt" / "step-0000000008" / "data")
    (tmp_path / "ckpt" / "step-0000000008" / "data" / "rank-00000-000-x.bin").write_bytes(
        b"partial"
    )
    assert cli_main(["ls", url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["complete"]) for r in rows] == [(7, True), (8, False)]
    assert cli_main(["verify", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert cli_main(["backends", "--json"]) == 0
    schemes = {r["scheme"]: r for r in json.loads(capsys.readouterr().out)}
    assert schemes["file"]["available"] and schemes["memory"]["available"]
    assert cli_main(["verify", f"file://{tmp_path}/empty"]) == 2


@pytest.mark.parametrize("empty", [None, {}, [], {"a": None}, {"a": {}, "b": [None, ()]}], ids=repr)
def test_a_state_with_nothing_to_save_is_refused(tmp_path: Path, empty: object) -> None:
    """``ckptio.save(None, ...)`` used to commit an empty checkpoint, which then became the
    newest one to resume from; a state holding no array and no value is refused instead."""
    with pytest.raises(errors.InvalidArgumentError, match="nothing to save"):
        ckptio.save(empty, str(tmp_path), step=1)
    with (
        ckptio.Checkpointer(str(tmp_path), async_save=True) as ck,
        pytest.raises(errors.InvalidArgumentError, match="nothing to save"),
    ):
        ck.save(empty, step=1)
    assert list(tmp_path.iterdir()) == []
    ckptio.save({"step": 0}, str(tmp_path), step=1)  # a value alone is something to save
    assert ckptio.load(str(tmp_path)) == {"step": 0}


# -- any integral step ------------------------------------------------------------------------

INTEGRAL_STEPS = [np.int64(7), np.uint8(7), np.int32(7), np.array(7)]


@pytest.mark.parametrize("step", INTEGRAL_STEPS, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("how", ["sync", "async", "checkpointer", "tiered"])
def test_any_integral_step_is_a_step(tmp_path: Path, step, how: str) -> None:
    """numpy integer scalars (a training loop's counter is often one) are steps everywhere a
    step is taken: save (sync and async), load, Checkpointer, the tiered checkpointer; the
    manifest holds a plain int."""
    url, state = f"file://{tmp_path}/run", {"w": np.arange(4.0)}
    if how in ("sync", "async"):
        ckptio.save(state, url, step=step, blocking=how == "sync").wait()
        got = ckptio.load(url, step=step)
    elif how == "checkpointer":
        with ckptio.Checkpointer(url, async_save=True) as c:
            handle = c.save(state, step=step)
            assert handle.wait().step == 7 and type(handle.step) is int
            got = c.load(step)
    else:
        with ckptio.Checkpointer(url, local=f"file://{tmp_path}/fast") as c:
            assert c.save(state, step=step).wait_drain().status == "durable"
            got = c.load(step)
    assert np.array_equal(got["w"], state["w"])
    assert json.loads((tmp_path / "run" / fmt.manifest_key(7)).read_bytes())["step"] == 7
    assert ckptio.open_checkpoint(url, step).step == 7


@pytest.mark.parametrize(
    "step, says",
    [
        (True, r"got True \(a bool\)"),
        (np.True_, r"got True \(a bool\)"),
        (7.0, r"got 7.0 \(float\) \(pass int\(step\) if it is a whole number\)"),
        (np.float64(7.0), r"got 7.0 \(float64\)"),
        ("7", r"got '7' \(str\)"),
        (None, r"got None \(NoneType\)"),
        (np.int64(-1), r"in \[0, 9999999999\], got -1$"),
        (10**10, r"got 10000000000$"),
    ],
)
def test_a_step_that_is_not_an_integer_is_refused_in_one_line(tmp_path: Path, step, says) -> None:
    url = f"file://{tmp_path}/run"
    for call in (
        lambda: ckptio.save({"w": np.zeros(1)}, url, step=step),
        lambda: ckptio.save({"w": np.zeros(1)}, url, step=step, blocking=False),
        lambda: ckptio.Checkpointer(url).save({"w": np.zeros(1)}, step),
    ):
        with pytest.raises(errors.InvalidArgumentError, match=says) as err:
            call()
        assert "\n" not in str(err.value)
    if step is not None:
        with pytest.raises(errors.InvalidArgumentError, match=says):
            ckptio.load(url, step=step)
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").rglob("manifest.json"))


def test_names_moved_out_of_ckptio_checkpoint_still_import_with_a_warning() -> None:
    """``ckptio.checkpoint`` exports what users and the layers above call (issue 31); what
    it exported before and no longer does still imports, with a warning naming the module
    that holds it now."""
    import importlib

    import ckptio.checkpoint as ck
    from ckptio.checkpoint import write

    with pytest.warns(DeprecationWarning, match="import it from ckptio.checkpoint.write"):
        assert ck.write_rank_shards is write.write_rank_shards
    for name, module in ck.MOVED.items():
        assert name not in ck.__all__ and hasattr(importlib.import_module(module), name), name
    with pytest.raises(AttributeError, match="no_such_name"):
        ck.no_such_name  # noqa: B018
    for name in ck.__all__:
        assert hasattr(ck, name), name
