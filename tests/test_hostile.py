"""Hostile checkpoints: whatever a manifest or the storage says, loading refuses it with an
error that names the problem, never opens anything outside the root, never allocates more
than the objects really hold, and never runs code."""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import ckptio
from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf
from ckptio.testing.moto import MOTO_AND_RGW

ROOT = Path(__file__).resolve().parents[1]


def make_checkpoint(root: Path, step: int = 7) -> dict:
    """A small committed checkpoint with 2 tensors in 2 objects; returns its manifest doc."""
    state = {
        "w": np.arange(4096, dtype=np.float32).reshape(64, 64),
        "b": np.arange(100, dtype=np.int16),
        "meta": {"lr": 0.1},
    }
    ckptio.save(state, f"file://{root}", step=step, chunk_size=4096, max_object_size=8192)
    return json.loads((root / fmt.manifest_key(step)).read_bytes())


def write_manifest(root: Path, data: bytes | dict, step: int = 7) -> None:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    (root / fmt.manifest_key(step)).write_bytes(raw)


def first_chunk(doc: dict) -> dict:
    return doc["tensors"]["w"]["chunks"][0]


def _set(path: str | tuple, value):
    """A mutation that sets doc[path...] (dotted or a tuple; ints index lists) to value."""

    def mutate(doc: dict) -> None:
        parts = (
            list(path)
            if isinstance(path, tuple)
            else [int(p) if p.isdigit() else p for p in path.split(".")]
        )
        node = doc
        for p in parts[:-1]:
            node = node[p]
        node[parts[-1]] = value

    return mutate


def _chunk(field_, value):
    return _set(f"tensors.w.chunks.0.{field_}", value)


def _deep_tree(doc: dict) -> None:
    node: dict = {"t": "w"}
    for _ in range(200):
        node = {"l": [node]}
    doc["tree"] = node


def _alias_bytes(doc: dict) -> None:
    """The memory bomb: many chunks pointing at the same bytes declare a huge tensor."""
    c = first_chunk(doc)
    n = 100_000
    doc["tensors"]["w"] = {
        "dtype": "float32",
        "shape": [64 * n, 16],
        "chunks": [dict(c, offsets=[64 * i, 0], shape=[64, 16]) for i in range(n)],
    }


def _rename_object(old_new):
    old, new = old_new

    def mutate(doc: dict) -> None:
        for t in doc["tensors"].values():
            for c in t["chunks"]:
                if c["key"] == old:
                    c["key"] = new
        doc["objects"][new] = doc["objects"].pop(old)

    return mutate


MUTATIONS = {
    # name: (mutation of the JSON doc, words the error must contain)
    "traversal_key": (_chunk("key", "data/../../../etc/passwd"), ["key"]),
    "traversal_object": (
        _rename_object(("data/rank-00000-000-x.bin", "../../outside.bin")),
        ["objects["],
    ),
    "absolute_key": (_chunk("key", "/etc/passwd"), ["key"]),
    "absolute_object": (_rename_object(("data/rank-00000-000-x.bin", "/etc/passwd")), ["objects["]),
    "backslash_key": (_chunk("key", "data\\..\\x"), ["key"]),
    "key_outside_data": (_chunk("key", "manifest.json"), ["key"]),
    "key_not_listed": (_chunk("key", "data/other.bin"), ["not listed in objects"]),
    "offset_past_end": (_chunk("offset", 1 << 40), ["offset", "past the end"]),
    "negative_offset": (_chunk("offset", -4096), ["offset", "out of range"]),
    "negative_length": (_chunk("length", -1), ["length"]),
    "negative_object_size": (
        _set(("objects", "data/rank-00000-000-x.bin"), -1),
        ["objects[", "out of range"],
    ),
    "huge_object_size": (
        _set(("objects", "data/rank-00000-000-x.bin"), 1 << 60),
        ["objects[", "out of range"],
    ),
    "negative_shape": (_set("tensors.w.shape", [-64, 64]), ["shape"]),
    "huge_shape": (_set("tensors.w.shape", [1 << 40, 1 << 40]), ["shape", "limit"]),
    "too_many_dims": (_set("tensors.w.shape", [1] * 40), ["shape", "dimensions"]),
    "shape_not_ints": (_set("tensors.w.shape", ["64", 64]), ["shape", "integer"]),
    "bool_as_int": (_chunk("offset", True), ["offset", "integer"]),
    "float_as_int": (_chunk("length", 16384.0), ["length", "integer"]),
    "length_vs_shape": (_chunk("length", 4), ["length", "disagrees"]),
    "chunk_outside_tensor": (_chunk("offsets", [60, 0]), ["exceeds"]),
    "unknown_dtype_object": (_set("tensors.w.dtype", "object"), ["dtype", "allowed"]),
    "unknown_dtype_numpy_code": (_set("tensors.w.dtype", "<f4"), ["dtype", "allowed"]),
    "unknown_dtype_pickle": (_set("tensors.w.dtype", "O"), ["dtype", "allowed"]),
    "dtype_not_string": (_set("tensors.w.dtype", {"__reduce__": "os.system"}), ["dtype"]),
    "deep_tree": (_deep_tree, ["tree", "deeper than"]),
    "tree_unknown_tensor": (_set("tree", {"t": "nope"}), ["tree", "not in tensors"]),
    "tree_bad_node": (_set("tree", {"x": 1}), ["tree", "not a valid tree node"]),
    "tree_two_kinds": (_set("tree", {"t": "w", "d": {}}), ["tree"]),
    "wrong_format": (_set("format", "torch"), ["format"]),
    "future_version": (_set("version", 2), ["version", "unsupported"]),
    "wrong_step": (_set("step", 8), ["step"]),
    "world_size_zero": (_set("world_size", 0), ["world_size"]),
    "objects_not_dict": (_set("objects", ["data/x"]), ["objects"]),
    "chunks_overlap": (
        lambda d: d["tensors"]["w"]["chunks"].append(dict(first_chunk(d))),
        ["chunks"],
    ),
    "bytes_shared_memory_bomb": (_alias_bytes, ["share bytes"]),
}


@pytest.fixture
def ckpt(tmp_path: Path):
    root = tmp_path / "run"
    doc = make_checkpoint(root)
    # rename the first object to a fixed name so mutations can address it
    first = first_chunk(doc)["key"]
    (root / "step-0000000007" / first).rename(
        root / "step-0000000007" / "data/rank-00000-000-x.bin"
    )
    _rename_object((first, "data/rank-00000-000-x.bin"))(doc)
    write_manifest(root, doc)
    assert ckptio.verify(f"file://{root}") == []
    return root, doc


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_hostile_manifest_refused_naming_the_problem(ckpt, name):
    root, doc = ckpt
    mutate, words = MUTATIONS[name]
    mutate(doc)
    write_manifest(root, doc)
    with pytest.raises(errors.ManifestError) as info:
        ckptio.load(f"file://{root}", step=7)
    message = str(info.value)
    for w in words:
        assert w in message, f"{name}: {w!r} not in {message!r}"
    # and the newest-complete search skips it rather than crash
    with pytest.raises(errors.NotFoundError):
        ckptio.load(f"file://{root}")


RAW = {
    "invalid_utf8": (b'{"format":"ckptio","version":1,"x":"\xff\xfe"}', "UTF-8"),
    "invalid_json": (b'{"format":"ckptio",', "not valid JSON"),
    "not_an_object": (b"[1,2,3]", "not a JSON object"),
    "duplicate_keys": (b'{"format":"ckptio","format":"ckptio"}', "duplicate key 'format'"),
    "nan_constant": (b'{"format":"ckptio","version":NaN}', "NaN"),
    "json_nesting_bomb": (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
    "huge_integer": (b'{"format":"ckptio","version":' + b"9" * 5000 + b"}", "not valid JSON"),
    "empty": (b"", "not valid JSON"),
}


@pytest.mark.parametrize("name", sorted(RAW))
def test_malformed_manifest_bytes_refused(ckpt, name):
    root, _ = ckpt
    data, words = RAW[name]
    write_manifest(root, data)
    with pytest.raises(errors.ManifestError, match=words.replace("(", r"\(")):
        ckptio.load(f"file://{root}", step=7)


def test_duplicate_key_inside_a_tensor_is_refused(ckpt):
    root, doc = ckpt
    text = json.dumps(doc)
    # a second "dtype" inside the tensor: JSON parsers disagree on which wins; we refuse
    text = text.replace('"dtype": "float32"', '"dtype": "float32", "dtype": "int8"', 1)
    write_manifest(root, text.encode())
    with pytest.raises(errors.ManifestError, match="duplicate key 'dtype'"):
        ckptio.load(f"file://{root}", step=7)


def test_oversized_manifest_refused_unread(ckpt, monkeypatch):
    root, _ = ckpt
    monkeypatch.setattr(fmt, "MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(errors.ManifestError, match="more than 1000"):
        ckptio.load(f"file://{root}", step=7)


# -- the storage lies -------------------------------------------------------------------------


def test_object_smaller_than_declared_is_refused_before_allocating(ckpt):
    """A validating manifest that declares a 32 TiB tensor in a 32 TiB object, while the
    object holds 4 KiB: refused by the size check, with no allocation near the declared size
    (tracemalloc sees numpy's allocations)."""
    root, doc = ckpt
    n = 1 << 45  # bytes; below MAX_TENSOR_BYTES, so the manifest itself validates
    doc["objects"]["data/rank-00000-000-x.bin"] = n
    doc["tensors"]["w"] = {
        "dtype": "uint8",
        "shape": [n],
        "chunks": [dict(first_chunk(doc), offsets=[0], shape=[n], offset=0, length=n)],
    }
    write_manifest(root, doc)
    mf.parse_manifest(json.dumps(doc).encode(), expect_step=7)  # it does validate
    tracemalloc.start()
    try:
        with pytest.raises(errors.CorruptCheckpointError, match="the manifest says 35184372088832"):
            ckptio.load(f"file://{root}", step=7)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"peak allocation {peak} bytes while refusing"


def test_truncated_object_detected(ckpt):
    root, _ = ckpt
    path = root / "step-0000000007" / "data/rank-00000-000-x.bin"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(errors.CorruptCheckpointError, match="the manifest says"):
        ckptio.load(f"file://{root}", step=7)


def test_flipped_byte_detected_naming_object_and_range(ckpt):
    root, _ = ckpt
    path = root / "step-0000000007" / "data/rank-00000-000-x.bin"
    raw = bytearray(path.read_bytes())
    raw[5] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(
        errors.ChecksumError, match=r"rank-00000-000-x\.bin: CRC32C mismatch in bytes 0\.\.4096"
    ):
        ckptio.load(f"file://{root}", step=7)


def test_symlink_leaving_the_root_is_refused(ckpt, tmp_path):
    """The data object is replaced by a symlink to a file outside the root holding exactly
    the right bytes: without the check the load would succeed; it is refused instead."""
    root, _ = ckpt
    obj = root / "step-0000000007" / "data/rank-00000-000-x.bin"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(obj.read_bytes())
    obj.unlink()
    obj.symlink_to(outside)
    with pytest.raises(errors.StoragePermissionError, match="resolves outside the root"):
        ckptio.load(f"file://{root}", step=7)


def test_symlinked_directory_leaving_the_root_is_refused(ckpt, tmp_path):
    root, _ = ckpt
    data = root / "step-0000000007" / "data"
    elsewhere = tmp_path / "elsewhere"
    data.rename(elsewhere)
    data.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(errors.StoragePermissionError, match="resolves outside the root"):
        ckptio.load(f"file://{root}", step=7)


def test_symlinked_manifest_leaving_the_root_is_refused(ckpt, tmp_path):
    root, doc = ckpt
    outside = tmp_path / "evil-manifest.json"
    outside.write_text(json.dumps(doc))
    m = root / fmt.manifest_key(7)
    m.unlink()
    m.symlink_to(outside)
    with pytest.raises(errors.StoragePermissionError, match="resolves outside the root"):
        ckptio.load(f"file://{root}", step=7)


def test_load_never_opens_outside_the_root_nor_runs_code(ckpt, tmp_path):
    """In a fresh process with an audit hook: loading hostile checkpoints (traversal keys,
    absolute keys, a symlink out of the root, a manifest that smuggles a pickle) opens no
    path outside the root and raises no code-execution audit event (exec, compile, pickle,
    marshal, os.system, subprocess, ctypes, import)."""
    root, doc = ckpt
    secret = tmp_path / "secret.bin"
    secret.write_bytes((root / "step-0000000007" / "data/rank-00000-000-x.bin").read_bytes())
    cases = {}
    for name in (
        "traversal_key",
        "absolute_key",
        "traversal_object",
        "dtype_not_string",
        "unknown_dtype_pickle",
    ):
        d = json.loads(json.dumps(doc))
        MUTATIONS[name][0](d)
        cases[name] = json.dumps(d)
    # keys that would reach the secret if joined naively
    rel = os.path.relpath(secret, root / "step-0000000007")
    d = json.loads(json.dumps(doc))
    _chunk("key", rel)(d)
    cases["relative_to_secret"] = json.dumps(d)
    d = json.loads(json.dumps(doc))
    _chunk("key", str(secret))(d)
    cases["absolute_secret"] = json.dumps(d)
    import base64
    import pickle  # only to build the hostile payload; never loaded

    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    payload = base64.b64encode(pickle.dumps(Boom())).decode()
    d = json.loads(json.dumps(doc))
    d["metadata"] = {"__pickle__": payload}
    d["tree"] = {"d": {"w": {"t": "w"}, "x": {"v": payload}}}
    cases["pickle_in_metadata"] = json.dumps(d)  # valid: loads as a plain string
    script = textwrap.dedent(
        """
        import json, os, sys
        import ckptio
        from ckptio import errors
        root, cases_path = sys.argv[1], sys.argv[2]
        cases = json.load(open(cases_path))
        manifest = os.path.join(root, "step-0000000007", "manifest.json")
        obj = os.path.join(root, "step-0000000007", "data", "rank-00000-000-x.bin")
        good = open(manifest, "rb").read()
        ckptio.load("file://" + root, step=7)  # warm: every lazy import is done
        WATCH = {"open", "exec", "compile", "pickle.find_class", "marshal.loads", "marshal.load",
                 "os.system", "os.exec", "os.posix_spawn", "subprocess.Popen", "ctypes.dlopen", "import"}
        events, outcomes = [], {}
        hooked = [False]
        def hook(event, args):
            if hooked[0] and event in WATCH:
                # resolve at the moment of the open (the test moves files afterwards)
                real = os.path.realpath(args[0]) if event == "open" and isinstance(args[0], str) else ""
                events.append([event, repr(args)[:300], real])
        sys.addaudithook(hook)
        def run(name):
            hooked[0] = True
            try:
                ckptio.load("file://" + root, step=7)
                outcomes[name] = "loaded"
            except errors.CkptioError as err:
                outcomes[name] = type(err).__name__ + ": " + str(err)[:200]
            finally:
                hooked[0] = False
        for name, text in cases.items():
            with open(manifest, "w") as f:
                f.write(text)
            run(name)
        with open(manifest, "wb") as f:
            f.write(good)
        os.rename(obj, obj + ".moved")
        os.symlink(sys.argv[3], obj)
        run("symlink_to_secret")
        print(json.dumps({"events": events, "outcomes": outcomes}))
        """
    )
    cases_path = tmp_path / "cases.json"
    cases_path.write_text(json.dumps(cases))
    proc = subprocess.run(
        [sys.executable, "-c", script, str(root), str(cases_path), str(secret)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    outcomes = report["outcomes"]
    assert outcomes["pickle_in_metadata"] == "loaded"  # just a string, never unpickled
    for name, outcome in outcomes.items():
        if name != "pickle_in_metadata":
            assert outcome.startswith(("ManifestError", "StoragePermissionError")), (name, outcome)
    opened = [e for e in report["events"] if e[0] == "open"]
    real_root = os.path.realpath(root)
    for _, args, real in opened:
        if real.startswith(("/proc/", "/sys/")):
            continue  # system information (file:// reads the mount table to detect a pfs)
        assert real.startswith(real_root + os.sep), f"opened outside the root: {args} -> {real}"
    assert any(real.startswith(real_root) for _, _, real in opened), "the hook saw no open at all"
    assert str(secret) not in json.dumps(report["events"])
    code = [e for e in report["events"] if e[0] != "open"]
    assert code == [], f"code-execution audit events during load: {code}"
    assert not (tmp_path / "pwned").exists()


# -- static: nothing on the load path can unpickle ---------------------------------------------

LOAD_PATH = [
    "ckptio/__init__.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "ckptio" / "checkpoint").glob("*.py")),
    "ckptio/format.py",
    "ckptio/store.py",
    "ckptio/registry.py",
    "ckptio/arrays.py",
    "ckptio/errors.py",
    "ckptio/trace.py",
    "ckptio/dist.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "backends").glob("*.py")),
]
FORBIDDEN_MODULES = {
    "pickle",
    "_pickle",
    "cPickle",
    "dill",
    "cloudpickle",
    "marshal",
    "shelve",
    "joblib",
}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}


def test_no_code_execution_primitive_on_the_load_path():
    """AST scan of every module a load goes through: no pickle-family import, no eval/exec/
    compile, no np.load/torch.load, no allow_pickle=True."""
    problems = []
    for rel in LOAD_PATH:
        tree = ast.parse((ROOT / rel).read_text(), rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [(node.module or "").split(".")[0]]
            else:
                names = []
            problems += [
                f"{rel}:{node.lineno}: imports {n}" for n in names if n in FORBIDDEN_MODULES
            ]
            if isinstance(node, ast.Call):
                f = node.func
                name = (
                    f.id
                    if isinstance(f, ast.Name)
                    else f.attr
                    if isinstance(f, ast.Attribute)
                    else ""
                )
                constant = all(isinstance(a, ast.Constant) for a in node.args)
                if (
                    isinstance(f, ast.Name)
                    and name in FORBIDDEN_CALLS
                    and not (name == "__import__" and constant)
                ):
                    problems.append(f"{rel}:{node.lineno}: calls {name}()")
                if (
                    isinstance(f, ast.Attribute)
                    and name == "load"
                    and isinstance(f.value, ast.Name)
                    and f.value.id in ("np", "numpy", "torch")
                ):
                    problems.append(f"{rel}:{node.lineno}: calls {f.value.id}.load()")
                for kw in node.keywords:
                    if kw.arg == "allow_pickle" and not (
                        isinstance(kw.value, ast.Constant) and kw.value.value is False
                    ):
                        problems.append(f"{rel}:{node.lineno}: allow_pickle")
    assert problems == [], problems
    assert len(LOAD_PATH) > 12  # the backends were found


# -- memory and blocking: what a hostile checkpoint may cost a reader ----------------------------

_PEAK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import ckptio
    from ckptio import errors
    from ckptio.cli import main
    url, good, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def peak():  # bytes: this image's high-water RSS (ru_maxrss would include the parent's
        # before exec: Linux carries it over fork and exec)
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

    ckptio.load(url, step=good)  # warm: every lazy import is done, pools exist
    base = peak()
    outcomes = {}
    for op in sys.argv[4:]:
        try:
            if op == "load":
                reader = ckptio.open_checkpoint(url)  # what ckptio.load(url) does
                reader.state()
                outcomes[op] = "loaded step %d" % reader.step
            elif op in ("ls", "gc"):
                outcomes[op] = "exit %s" % main([op, url, "--json"])
            elif op == "verify":
                outcomes[op] = "problems %s" % ckptio.verify(url)
            elif op == "retention":
                with ckptio.Checkpointer(url, keep_last=3) as ck:
                    ck.save({"w": np.zeros(4, np.float32)}, step=new)
                outcomes[op] = "saved"
        except errors.CkptioError as err:
            outcomes[op] = type(err).__name__ + ": " + str(err)[:300]
    print(json.dumps({"base": base, "peak": peak(), "outcomes": outcomes}))
    """
)


def _peak_of(root: Path | str, ops: list[str], good_step: int, new_step: int = 0) -> dict:
    """Peak RSS (bytes) of a fresh process running ``ops`` one after another on ``root`` (a
    directory, or a URL), and of the same process before them (warmed up by loading
    ``good_step``)."""
    url = root if isinstance(root, str) else f"file://{root}"
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, url, str(good_step), str(new_step), *ops],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _bomb(n_bytes: int) -> str:
    """JSON of ``n_bytes`` bytes that json decodes into ~28x that: nested empty lists."""
    return "[" + ",".join(["[[]]"] * (n_bytes // 5)) + "]"


FREE_FORM_BOMBS = {
    # where the bomb sits: (mutation of the manifest text, built from the doc and the bomb)
    "metadata": lambda doc, bomb: json.dumps(dict(doc, metadata="@")).replace('"@"', bomb),
    "tree": lambda doc, bomb: json.dumps(
        dict(doc, tree={"d": {"w": {"t": "w"}, "x": {"v": "@"}}})
    ).replace('"@"', bomb),
    # a repeated key: msgspec keeps the last (small) value, json would build the first
    "repeated_metadata": lambda doc, bomb: json.dumps(dict(doc, metadata="@")).replace(
        '"metadata": "@"', f'"metadata": {bomb}, "metadata": 1'
    ),
}


@pytest.mark.parametrize("where", sorted(FREE_FORM_BOMBS))
def test_free_form_json_bomb_bounded_in_load_ls_gc_and_retention(tmp_path, where):
    """A committed-looking newest manifest whose free-form JSON is 32 MiB of nested empty
    lists (valid JSON, far under the 1 GiB manifest limit) would decode into ~900 MiB of
    Python objects. It is refused from its raw text before decoding (fmt.MAX_METADATA_BYTES,
    fmt.MAX_FREE_VALUES): in a fresh process, load (falling back to the older good step),
    ls, gc and a save's retention each stay under the manifest's size plus 32 MiB (it is read once)."""
    root = tmp_path / "run"
    make_checkpoint(root, step=5)
    doc = make_checkpoint(root, step=7)
    text = FREE_FORM_BOMBS[where](doc, _bomb(32 << 20))
    write_manifest(root, text.encode(), step=7)
    size = len(text)
    got = _peak_of(root, ["load", "ls", "gc", "retention"], good_step=5, new_step=9)
    grew = got["peak"] - got["base"]
    assert grew < size + (32 << 20), (
        f"peak grew by {grew >> 20} MiB for a {size >> 20} MiB manifest ({got})"
    )
    assert got["outcomes"] == {
        "load": "loaded step 5",
        "ls": "exit 0",
        "gc": "exit 0",
        "retention": "saved",
    }, got
    with pytest.raises(errors.ManifestError, match=where.replace("repeated_", "")):
        ckptio.load(f"file://{root}", step=7)


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ckptio.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, COLUMNS="400"),  # one line per message: rich wraps at 80 otherwise
    )


NOT_REGULAR = {
    "fifo": (lambda p: os.mkfifo(p), "a FIFO"),
    "directory": (lambda p: p.mkdir(), "a directory"),
}


@pytest.mark.parametrize("kind", sorted(NOT_REGULAR))
def test_non_regular_data_object_refused_without_blocking(ckpt, kind):
    """A FIFO (or a directory) where a data object should be: `ckptio verify` reports it and
    exits 1 instead of blocking forever in open() (the FIFO) or crashing; `ls` and `gc` list
    and clean as usual; a load refuses it naming it. Every file:// open is O_NONBLOCK, then
    fstat-checked (open_regular)."""
    root, _ = ckpt
    obj = root / "step-0000000007" / "data/rank-00000-000-x.bin"
    obj.unlink()
    make, words = NOT_REGULAR[kind]
    make(obj)
    try:
        proc = _cli("verify", f"file://{root}", timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ckptio verify blocked on {kind} for 60 s")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        f"rank-00000-000-x.bin: it is {words}, not a regular file" in proc.stdout + proc.stderr
    ), proc
    for cmd in ("ls", "gc"):
        proc = _cli(cmd, f"file://{root}", "--json", timeout=60)
        assert proc.returncode == 0, (cmd, proc.stdout + proc.stderr)
    with pytest.raises(
        errors.CorruptCheckpointError, match=f"rank-00000-000-x.bin: refusing .*it is {words}"
    ):
        ckptio.load(f"file://{root}", step=7)


def test_symlink_out_of_the_root_leaks_no_size(ckpt, tmp_path):
    """size() applies the out-of-root check of reads: a data object symlinked to a file
    outside the root neither gives that file's size (`ckptio ls` sums sizes) nor anything else."""
    root, _ = ckpt
    obj = root / "step-0000000007" / "data/rank-00000-000-x.bin"
    outside = tmp_path / "secret-size.bin"
    with open(outside, "wb") as f:
        f.truncate(987_654_321)  # a size that shows wherever it leaks
    obj.unlink()
    obj.symlink_to(outside)
    store = ckptio.open_store(f"file://{root}")
    with pytest.raises(errors.StoragePermissionError, match="resolves outside the root"):
        store.size("step-0000000007/data/rank-00000-000-x.bin")
    with pytest.raises(errors.StoragePermissionError, match="resolves outside the root"):
        store.get("step-0000000007/data/rank-00000-000-x.bin")
    proc = _cli("ls", f"file://{root}", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "987654321" not in proc.stdout and "942" not in proc.stdout  # bytes, MiB
    assert ckptio.verify(f"file://{root}")  # reported, not read


def test_foreign_files_under_the_root_are_left_alone(tmp_path):
    """Files ckptio never writes and cannot name as keys (a space in the name) in a committed
    step and in a step without a manifest: ``ls``, ``gc`` and a save's retention work, and
    leave them where they are (they are someone else's)."""
    root = tmp_path / "run"
    make_checkpoint(root, step=7)
    (root / "step-0000000008").mkdir()
    foreign = [root / "step-0000000007" / "notes by hand.txt", root / "step-0000000008" / "a b"]
    for f in foreign:
        f.write_text("not ckptio's")
    for cmd in ("ls", "gc"):
        proc = _cli(cmd, f"file://{root}", "--json")
        assert proc.returncode == 0, (cmd, proc.stdout + proc.stderr)
    with ckptio.Checkpointer(f"file://{root}", keep_last=1, retire_grace=0) as c:
        c.save({"w": np.zeros(4, np.float32)}, step=9)
    ckptio.collect_garbage(ckptio.open_store(f"file://{root}"), unfinished=True)
    assert not list((root / "step-0000000007").rglob("*.bin")), "retention left step 7's data"
    assert all(f.read_text() == "not ckptio's" for f in foreign)
    assert ckptio.open_checkpoint(f"file://{root}").step == 9


def _unreadable(m: Path, tmp_path: Path) -> None:
    m.chmod(0)


_UNREADABLE_SCRIPT = textwrap.dedent(
    """
    import ctypes, os, sys
    if os.geteuid() == 0:  # drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH: chmod 000 then holds
        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
        libc = ctypes.CDLL(None, use_errno=True)
        header, data = Header(0x20080522, 0), (Data * 2)()
        assert libc.capget(ctypes.byref(header), data) == 0
        data[0].effective &= ~((1 << 1) | (1 << 2))
        assert libc.capset(ctypes.byref(header), data) == 0, os.strerror(ctypes.get_errno())
    import ckptio
    from ckptio import errors
    try:
        ckptio.load("file://" + sys.argv[1], step=8)
    except errors.StoragePermissionError as err:
        print("explicit:", type(err).__name__, err)
    print("loaded", ckptio.open_checkpoint("file://" + sys.argv[1]).step)
    """
)


NEWEST_REFUSED = {
    # how the newest manifest is spoiled: (spoil(manifest path, tmp_path), error of an explicit load)
    "symlink_out_of_root": (
        lambda m, tmp: (
            tmp.joinpath("m.json").write_bytes(m.read_bytes()),
            m.unlink(),
            m.symlink_to(tmp / "m.json"),
        ),
        "StoragePermissionError",
    ),
    "fifo": (lambda m, tmp: (m.unlink(), os.mkfifo(m)), "NotRegularFileError"),
    "unreadable": (_unreadable, "StoragePermissionError"),
    "damaged": (lambda m, tmp: m.write_bytes(m.read_bytes()[:-9]), "ManifestError"),
}


@pytest.mark.parametrize("how", sorted(NEWEST_REFUSED))
def test_refused_newest_manifest_falls_back_to_the_newest_good_step(tmp_path, how, caplog):
    """The newest manifest is refused (a symlink out of the root, a FIFO, unreadable) or
    damaged: a load that names no step warns, naming the step and why, and loads the newest
    good one; a load that names the step raises a ckptio error naming the key. (Unreadable
    loads in a process that drops root's power to read what chmod 000 forbids.)"""
    root = tmp_path / "run"
    make_checkpoint(root, step=5)
    make_checkpoint(root, step=8)
    spoil, error = NEWEST_REFUSED[how]
    manifest = root / fmt.manifest_key(8)
    spoil(manifest, tmp_path)
    if how == "unreadable":  # in a process without root's power to read anything
        proc = subprocess.run(
            [sys.executable, "-c", _UNREADABLE_SCRIPT, str(root)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (
            "explicit: StoragePermissionError" in proc.stdout and "manifest.json" in proc.stdout
        ), proc.stdout
        assert "loaded 5" in proc.stdout, proc.stdout
        assert "skipping step 8" in proc.stderr and "Permission denied" in proc.stderr, proc.stderr
        return
    with pytest.raises(
        getattr(errors, error, errors.CkptioError), match=r"step-0000000008/manifest\.json"
    ):
        ckptio.load(f"file://{root}", step=8)
    with caplog.at_level("WARNING", logger="ckptio"):
        reader = ckptio.open_checkpoint(f"file://{root}")
    assert reader.step == 5
    reader.state()
    assert "skipping step 8" in caplog.text and "manifest.json" in caplog.text, caplog.text


def _sparse_checkpoint(root: Path, apparent: int, declared: int) -> None:
    """Step 7 whose one data object is a sparse file of ``apparent`` bytes (a few KiB on
    disk), holding a uint8 tensor ``w`` of ``declared`` bytes at offset 0 (its CRC is of zeros,
    up to 4 GiB; 0 beyond, for tests that never read it)."""
    import crc32c

    doc = make_checkpoint(root)
    key = first_chunk(doc)["key"]
    for k in list(doc["objects"]):
        if k != key:
            (root / "step-0000000007" / k).unlink()
    with open(root / "step-0000000007" / key, "r+b") as f:
        f.truncate(0)
        f.truncate(apparent)
    crc = 0
    zeros = bytes(16 << 20)
    for start in range(0, declared if declared <= 4 << 30 else 0, len(zeros)):  # larger: never read
        crc = crc32c.crc32c(zeros[: min(len(zeros), declared - start)], crc)
    chunk = dict(
        first_chunk(doc), offsets=[0], shape=[declared], offset=0, length=declared, crc32c=crc
    )
    doc.update(
        objects={key: apparent},
        tensors={"w": {"dtype": "uint8", "shape": [declared], "chunks": [chunk]}},
        tree={"d": {"w": {"t": "w"}}},
    )
    write_manifest(root, doc)


def _vm(field_: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field_ + ":"))


def test_load_larger_than_the_machine_refused_before_allocating(tmp_path):
    """A manifest declaring a tensor of twice this machine's memory and swap, in a sparse
    object that stat() confirms (it holds a few KiB on disk): the load raises
    InsufficientMemoryError naming both sizes, before mapping the memory (VmPeak, the
    process's largest address space, stays put), whole or through select=."""
    with open("/proc/meminfo") as f:
        swap = next(int(line.split()[1]) * 1024 for line in f if line.startswith("SwapTotal:"))
    n = fmt.align_up(2 * (os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") + swap))
    root = tmp_path / "run"
    _sparse_checkpoint(root, apparent=n, declared=n)
    refused = getattr(errors, "InsufficientMemoryError", errors.CkptioError)
    before = _vm("VmPeak")
    with pytest.raises(
        refused, match=f"needs {n} bytes of memory, more than this machine can give"
    ):
        ckptio.load(f"file://{root}", step=7)
    with pytest.raises(refused, match=f"needs {n + 16} bytes of memory"):  # 16 + the chunk's buffer
        ckptio.load(f"file://{root}", step=7, select={"w": np.s_[:16]})
    assert _vm("VmPeak") - before < 1 << 30


def test_sparse_object_load_allocates_the_declared_bytes(tmp_path):
    """A sparse object of 1 GiB by stat() (a few KiB on disk) with a tensor declaring 64 MiB:
    a fresh process's peak grows by the declared bytes (plus 32 MiB), not the apparent size;
    that is the bound of a load: the declared bytes of what it returns, plus its read buffers."""
    root = tmp_path / "run"
    declared = 64 << 20
    make_checkpoint(root, step=5)  # what the process warms up on
    _sparse_checkpoint(root, apparent=1 << 30, declared=declared)
    got = _peak_of(root, ["load"], good_step=5)
    assert got["outcomes"] == {"load": "loaded step 7"}, got
    grew = got["peak"] - got["base"]
    assert grew < declared + (32 << 20), (
        f"peak grew by {grew >> 20} MiB for {declared >> 20} MiB declared"
    )


def test_metadata_limits_hold_at_save_and_leave_room_for_real_metadata(tmp_path):
    """Metadata a load would refuse (fmt.MAX_FREE_VALUES, fmt.MAX_METADATA_BYTES) is refused by
    the save, before anything is written; metadata just under the limits saves and loads."""
    url = f"file://{tmp_path / 'run'}"
    state = {"w": np.arange(8, dtype=np.float32)}
    with pytest.raises(
        errors.InvalidArgumentError,
        match="metadata holds 1100001 JSON values and keys, more than the limit of 1000000",
    ):
        ckptio.save(state, url, step=1, metadata=[0] * 1_100_000)
    with pytest.raises(
        errors.InvalidArgumentError,
        match="metadata 17825794 bytes of JSON, more than the limit of 16777216",
    ):
        ckptio.save(state, url, step=1, metadata="x" * (17 << 20))
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
    big = {
        "losses": [0.5] * 300_000,
        "config": {f"k{i}": "v" * 20 for i in range(50_000)},
        "vocab": "t" * (4 << 20),
    }
    ckptio.save(state, url, step=2, metadata=big)
    assert ckptio.open_checkpoint(url).metadata == big


def test_verify_holds_a_block_whatever_a_chunk_declares(tmp_path):
    """verify reads a chunk larger than VERIFY_BLOCK_BYTES in blocks with a running CRC32C: a
    1 GiB chunk (of a sparse object) costs a fresh process at most 64 MiB, not 1 GiB."""
    root = tmp_path / "run"
    make_checkpoint(root, step=5)
    _sparse_checkpoint(root, apparent=1 << 30, declared=1 << 30)
    got = _peak_of(root, ["verify"], good_step=5)
    assert got["outcomes"] == {"verify": "problems []"}, got
    grew = got["peak"] - got["base"]
    assert grew < 64 << 20, f"peak grew by {grew >> 20} MiB verifying a 1 GiB chunk"


# -- the same hostility on object storage ---------------------------------------------------------
#
# An S3 checkpoint is written by ckptio, then spoiled out of band with a boto3 client, and read
# through each S3 client (their get/size/list/ranged reads differ; ``s3://`` is ``s3+boto3``)
# against the moto server and against Ceph RGW (a real S3 implementation).

S3_SCHEMES = ["s3", "s3+fsspec", "s3+arrow", "s3+obstore"]
FIXED = "data/rank-00000-000-x.bin"
"""The name the first data object is given, so mutations can address it."""


class S3Root:
    """A checkpoint root ``<prefix>/`` in a bucket, read through ``scheme`` and spoiled through
    a boto3 client (keys relative to the root)."""

    def __init__(self, client, bucket: str, scheme: str, prefix: str = "run") -> None:
        self.client, self.bucket, self.scheme, self.prefix = client, bucket, scheme, prefix

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}"

    @functools.cached_property
    def store(self):
        """One store for the test's loads (a client per load would cost more than the load)."""
        return ckptio.open_store(self.url)

    def put(self, rel: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}/{rel}", Body=data)

    def get(self, rel: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=f"{self.prefix}/{rel}")["Body"].read()

    def delete(self, rel: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=f"{self.prefix}/{rel}")

    def listed(self) -> set[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
        return {o["Key"] for page in pages for o in page.get("Contents", [])}

    def save(self, step: int) -> dict:
        """A small committed checkpoint (as make_checkpoint), written through ``s3://``."""
        state = {
            "w": np.arange(4096, dtype=np.float32).reshape(64, 64),
            "b": np.arange(100, dtype=np.int16),
            "meta": {"lr": 0.1},
        }
        url = f"s3://{self.bucket}/{self.prefix}"
        ckptio.save(state, url, step=step, chunk_size=4096, max_object_size=8192)
        return json.loads(self.get(fmt.manifest_key(step)))

    def write_manifest(self, data: bytes | str | dict, step: int = 7) -> None:
        raw = (
            data
            if isinstance(data, bytes)
            else data.encode()
            if isinstance(data, str)
            else json.dumps(data).encode()
        )
        self.put(fmt.manifest_key(step), raw)


@pytest.fixture
def s3_root(scheme, s3_bucket, s3_client) -> Iterator[S3Root]:
    root = S3Root(s3_client, s3_bucket, scheme)
    yield root
    if "store" in vars(root):
        root.store.close()


@pytest.fixture
def s3_ckpt(s3_root: S3Root):
    """Step 7 committed on S3, its first data object renamed to FIXED; (root, manifest doc)."""
    doc = s3_root.save(7)
    first = first_chunk(doc)["key"]
    s3_root.put(f"step-0000000007/{FIXED}", s3_root.get(f"step-0000000007/{first}"))
    s3_root.delete(f"step-0000000007/{first}")
    _rename_object((first, FIXED))(doc)
    s3_root.write_manifest(doc)
    assert ckptio.verify(s3_root.store) == []
    return s3_root, doc


s3_hostile = [
    pytest.mark.s3,
    MOTO_AND_RGW,
    pytest.mark.parametrize("scheme", S3_SCHEMES),
]


def _apply(marks):
    def decorate(fn):
        for mark in reversed(marks):
            fn = mark(fn)
        return fn

    return decorate


S3_MUTATIONS = [
    "traversal_key",
    "traversal_object",
    "absolute_key",
    "key_outside_data",
    "huge_object_size",
    "huge_shape",
    "wrong_step",
]
"""What reaches outside the step or declares impossible sizes (the rest of MUTATIONS is
validation of the JSON, the same whatever the storage)."""


@_apply(s3_hostile)
def test_s3_hostile_manifest_refused_and_nothing_outside_the_root_read(s3_ckpt):
    """Manifests naming keys outside the step (``..``, absolute, the manifest itself) or
    declaring impossible sizes are refused naming the problem, and a load of the newest step
    skips them. S3 does not normalise ``..``: the object a naive join would reach is planted
    both where a normalising client would look and under the literal key, holding exactly the
    right bytes, so only the check stops the load."""
    root, doc = s3_ckpt
    good = root.get(f"step-0000000007/{FIXED}")
    root.client.put_object(Bucket=root.bucket, Key="etc/passwd", Body=good)
    root.client.put_object(Bucket=root.bucket, Key="outside.bin", Body=good)
    root.put("step-0000000007/data/../../../etc/passwd", good)
    root.put("step-0000000007/../../outside.bin", good)
    failures = []
    for name in S3_MUTATIONS:
        mutate, words = MUTATIONS[name]
        d = json.loads(json.dumps(doc))
        mutate(d)
        root.write_manifest(d)
        try:
            ckptio.load(root.store, step=7)
            failures.append(f"{name}: loaded")
        except errors.ManifestError as err:
            if missing := [w for w in words if w not in str(err)]:
                failures.append(f"{name}: {missing} not in {err}")
        with pytest.raises(errors.NotFoundError):
            ckptio.load(root.store)
    assert failures == []


@_apply(s3_hostile)
def test_s3_object_smaller_than_declared_is_refused_before_allocating(s3_ckpt):
    """A manifest declaring a 32 TiB tensor in a 32 TiB object that holds 4 KiB: the size
    (HEAD) check refuses it, with no allocation near the declared size (an object as large as
    the declaration, which S3 servers here hold in memory, is left to the file:// test)."""
    root, doc = s3_ckpt
    n = 1 << 45
    doc["objects"][FIXED] = n
    doc["tensors"]["w"] = {
        "dtype": "uint8",
        "shape": [n],
        "chunks": [dict(first_chunk(doc), offsets=[0], shape=[n], offset=0, length=n)],
    }
    root.write_manifest(doc)
    tracemalloc.start()
    try:
        with pytest.raises(errors.CorruptCheckpointError, match="the manifest says 35184372088832"):
            ckptio.load(root.store, step=7)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # (the moto server runs in this process: its request handling is traced too)
    assert peak < 64 * 2**20, f"peak allocation {peak} bytes while refusing"


@_apply(s3_hostile)
def test_s3_truncated_or_flipped_object_detected(s3_ckpt):
    root, _ = s3_ckpt
    raw = root.get(f"step-0000000007/{FIXED}")
    root.put(f"step-0000000007/{FIXED}", raw[:-100])
    with pytest.raises(errors.CorruptCheckpointError, match="the manifest says"):
        ckptio.load(root.store, step=7)
    flipped = bytearray(raw)
    flipped[5] ^= 0x40
    root.put(f"step-0000000007/{FIXED}", bytes(flipped))
    with pytest.raises(
        errors.ChecksumError, match=r"rank-00000-000-x\.bin: CRC32C mismatch in bytes 0\.\.4096"
    ):
        ckptio.load(root.store, step=7)


S3_NEWEST_SPOILED = {
    # how the newest manifest is spoiled out of band: (spoil(root, manifest rel key), error of
    # an explicit load, or None where step 8 is then not committed at all)
    "damaged": (lambda r, m: r.put(m, r.get(m)[:-9]), errors.ManifestError),
    "empty": (lambda r, m: r.put(m, b""), errors.ManifestError),
    "not_json": (lambda r, m: r.put(m, b"\x00" * 4096), errors.ManifestError),
    "oversized": (
        lambda r, m: r.put(m, json.dumps(dict(json.loads(r.get(m)), pad="x" * (2 << 20))).encode()),
        errors.ManifestError,
    ),
    "missing": (lambda r, m: r.delete(m), None),
    "folder_marker_instead": (lambda r, m: (r.delete(m), r.put(m + "/", b"")), None),
}


@_apply(s3_hostile)
def test_s3_spoiled_newest_manifest_falls_back_to_the_newest_good_step(
    s3_root, monkeypatch, caplog
):
    """The newest manifest is damaged, empty, garbage, larger than the limit, missing, or a
    folder marker stands where it should be: a load that names no step loads the newest good
    one (warning when a manifest was there but refused); a load naming the step raises a
    ckptio error naming the key."""
    monkeypatch.setattr(fmt, "MAX_MANIFEST_BYTES", 1 << 20)
    root = s3_root
    root.save(5)
    root.save(8)
    manifest = fmt.manifest_key(8)
    good = root.get(manifest)
    for how, (spoil, error) in S3_NEWEST_SPOILED.items():
        root.write_manifest(good, step=8)
        for k in root.listed():
            if k.startswith(f"{root.prefix}/{manifest}/"):
                root.client.delete_object(Bucket=root.bucket, Key=k)
        spoil(root, manifest)
        with pytest.raises(error or errors.NotFoundError, match=r"step-0000000008|step 8"):
            ckptio.load(root.store, step=8)
        caplog.clear()
        with caplog.at_level("WARNING", logger="ckptio"):
            reader = ckptio.open_checkpoint(root.store)
        assert reader.step == 5, how
        reader.state()
        if error is not None:
            assert "skipping step 8" in caplog.text and "manifest.json" in caplog.text, (
                how,
                caplog.text,
            )


@_apply(s3_hostile)
def test_s3_odd_keys_beside_a_checkpoint(s3_root):
    """Keys a POSIX tree cannot hold, or tools leave in buckets, beside a committed step: a
    folder marker for the root and a step, an object named like the root itself, a doubled
    slash, an unpadded or suffixed step name, a manifest-named prefix, and a complete copy of
    the checkpoint under a sibling prefix that shares the root's name as a string prefix.
    Loading takes the real newest step, ``ls`` and ``gc`` work, and nothing outside the root
    is read as part of it or removed."""
    root = s3_root
    doc = root.save(7)
    sibling = S3Root(root.client, root.bucket, "s3", prefix="run2")
    sibling.save(9)  # a newer, valid checkpoint, outside the root: never ours
    manifest7 = root.get(fmt.manifest_key(7))
    odd = {
        "": b"",  # "run/": a folder marker for the root
        "step-0000000008/": b"",
        "step-0000000009x/manifest.json": manifest7,
        "step-12/manifest.json": manifest7,
        "step-0000000011//manifest.json": manifest7,
        "step-0000000010/manifest.json/": b"",
        "step-0000000010/manifest.json/x": manifest7,
        "step-0000000013/manifest.json.tmp": manifest7,
    }
    for rel, data in odd.items():
        root.put(rel, data)
    root.client.put_object(Bucket=root.bucket, Key="run", Body=b"an object named like the root")
    outside = {k for k in root.listed() if not k.startswith("run/")}
    reader = ckptio.open_checkpoint(root.store)
    assert reader.step == 7
    assert state_equal(reader.state(), doc)
    assert ckptio.Checkpointer(root.store).steps() == [7]
    from ckptio.cli import main

    assert main(["ls", root.url, "--json"]) == 0
    assert ckptio.verify(root.store) == []
    ckptio.collect_garbage(root.store, unfinished=True)
    assert outside <= root.listed(), "gc removed objects outside the root"
    assert ckptio.verify(root.store) == [] and ckptio.open_checkpoint(root.store).step == 7


def state_equal(state: dict, doc: dict) -> bool:
    return (
        doc["step"] == 7
        and np.array_equal(state["w"], np.arange(4096, dtype=np.float32).reshape(64, 64))
        and np.array_equal(state["b"], np.arange(100, dtype=np.int16))
        and state["meta"] == {"lr": 0.1}
    )


@_apply(s3_hostile)
def test_s3_free_form_json_bomb_bounded_in_load_ls_gc_and_retention(s3_root):
    """The metadata bomb of test_free_form_json_bomb_bounded_in_load_ls_gc_and_retention (16 MiB
    of nested lists, ~450 MiB decoded) in the newest manifest of an S3 checkpoint, read through
    each client in a fresh process: load falls back to the older good step, and load, ls, gc
    and retention stay under twice the manifest's size plus 32 MiB (an object is received into
    a buffer, then copied once into ``bytes``: Store.get). s3fs: four times (it receives on its
    own event-loop thread, whose freed memory glibc does not hand to the main thread's
    allocations: the peaks of the four commands add up)."""
    root = s3_root
    root.save(5)
    doc = root.save(7)
    text = FREE_FORM_BOMBS["metadata"](doc, _bomb(16 << 20))
    root.write_manifest(text, step=7)
    size = len(text)
    got = _peak_of(root.url, ["load", "ls", "gc", "retention"], good_step=5, new_step=9)
    grew = got["peak"] - got["base"]
    factor = 4 if root.scheme == "s3+fsspec" else 2
    assert grew < factor * size + (32 << 20), (
        f"peak grew by {grew >> 20} MiB for a {size >> 20} MiB manifest ({got})"
    )
    assert got["outcomes"] == {
        "load": "loaded step 5",
        "ls": "exit 0",
        "gc": "exit 0",
        "retention": "saved",
    }, got
    with pytest.raises(errors.ManifestError, match="metadata"):
        ckptio.load(root.store, step=7)


# -- work bounded by what is stored, not by what a manifest declares --------------------------

#: a hang guard for the commands below, not a timing claim: each answers in well under a second
#: here; unbounded (before), verify read a 4 TiB hole for hours and each sparse manifest for ~2 s
HANG_GUARD_SECONDS = 300


def _ckptio(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckptio.cli", *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )


def test_verify_of_a_sparse_object_declaring_4_tib_reads_only_what_is_stored(tmp_path):
    """A manifest declaring one 4 TiB chunk in a sparse file of that size (a few KiB stored,
    its CRC not that of 4 TiB of zeros): ``ckptio verify`` reads the stored bytes only, adds
    the holes' zeros to the CRC by computation, and reports the mismatch naming the object
    and that it is sparse; it shows its progress on stderr. A sparse object whose chunk is
    really zeros (1 GiB, its true CRC) verifies clean."""
    root = tmp_path / "run"
    make_checkpoint(root, step=5)
    _sparse_checkpoint(root, apparent=1 << 42, declared=1 << 42)
    key = next(iter(json.loads((root / fmt.manifest_key(7)).read_bytes())["objects"]))
    proc = _ckptio("verify", f"file://{root}", "--step", "7", "--json")
    assert proc.returncode == 1, proc.stderr
    problems = json.loads(proc.stdout)["problems"]
    assert len(problems) == 1, problems
    assert f"step-0000000007/{key}: CRC32C mismatch in bytes 0..{1 << 42}" in problems[0]
    assert f"a sparse file: {1 << 42} bytes by its size" in problems[0], problems
    assert "verify step 7 (4.0 TiB declared)" in proc.stderr, proc.stderr
    clean = tmp_path / "zeros"
    make_checkpoint(clean, step=5)
    _sparse_checkpoint(clean, apparent=1 << 30, declared=1 << 30)
    proc = _ckptio("verify", f"file://{clean}", "--step", "7", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["problems"] == [], proc.stdout


def test_sparse_manifests_just_under_the_size_limit_are_refused_unread(tmp_path):
    """Twenty steps whose manifest is a sparse file of just under ``MAX_MANIFEST_BYTES`` (a
    JSON head, then a hole): ``ls`` lists each as refused for being sparse, ``verify`` and
    ``load`` skip them for the intact step 1, ``gc`` leaves the root as it is, none of them
    reads the holes (a fresh process's peak memory stays far below one manifest's size)."""
    root = tmp_path / "run"
    make_checkpoint(root, step=1)
    head = (root / fmt.manifest_key(1)).read_bytes()[:64]
    for step in range(2, 22):
        path = root / fmt.manifest_key(step)
        path.parent.mkdir(parents=True)
        with open(path, "wb") as f:
            f.write(head)
            f.truncate(fmt.MAX_MANIFEST_BYTES - 1)
    url = f"file://{root}"
    listed = _ckptio("ls", url, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["step"]: r for r in json.loads(listed.stdout)}
    assert rows[1]["complete"] and not rows[1]["problem"]
    for step in range(2, 22):
        assert not rows[step]["complete"], rows[step]
        said = f"{fmt.manifest_key(step)}: {fmt.MAX_MANIFEST_BYTES - 1} bytes by its size, but a"
        assert f"{said} sparse file with a hole at byte 4096" in rows[step]["problem"], rows[step]
    verified = _ckptio("verify", url, "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["step"] == 1, verified
    assert verified.stderr.count("sparse file with a hole") == 20, verified.stderr
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    assert _ckptio("gc", url).returncode == 0
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    got = _peak_of(root, ["load"], good_step=1)
    assert got["outcomes"] == {"load": "loaded step 1"}, got
    assert got["peak"] - got["base"] < 64 << 20, got


@pytest.mark.parametrize("n", [0, 1, 4095, 1 << 16, (1 << 16) + 1, 3 << 20, (1 << 24) + 12345])
def test_crc32c_of_a_hole_is_that_of_its_zeros(n):
    """What verify adds for a hole equals the CRC32C of the zeros read, from any prior CRC."""
    import crc32c

    from ckptio.checkpoint.crcs import crc32c_zeros

    for prior in (0, 0xDEADBEEF, crc32c.crc32c(b"ckptio")):
        assert crc32c_zeros(prior, n) == crc32c.crc32c(bytes(n), prior), (prior, n)
