"""JAX arrays and pytrees (CPU jax) through ckptio."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import ckptio  # noqa: E402
import ckptio.jax as cj  # noqa: E402
from ckptio import errors  # noqa: E402


class AdamState(NamedTuple):
    count: jax.Array
    mu: dict
    nu: dict


def _tree() -> dict:
    k = jax.random.PRNGKey(0)
    w = jax.random.normal(k, (16, 8), dtype=jnp.float32)
    b = jnp.arange(8, dtype=jnp.bfloat16)
    params = {"dense": {"w": w, "b": b}, "layers": [w * 2, None, jnp.ones((3,), jnp.int32)]}
    opt = AdamState(jnp.array(7, jnp.int32), {"w": w + 1, "b": b}, {"w": w * 0, "b": b})
    return {
        "params": params,
        "opt": opt,
        "step": 100,
        "lr": 0.5,
        "name": "run-1",
        "pair": (w[0], 3),
    }


def _same(a: object, b: object) -> None:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, jax.Array):
            assert isinstance(y, jax.Array) and x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(
                np.asarray(x).reshape(-1).view(np.uint8), np.asarray(y).reshape(-1).view(np.uint8)
            )
        else:
            assert x == y and type(x) is type(y)


def test_pytree_round_trip_with_target(tmp_path: Path) -> None:
    tree = _tree()
    cj.save(tree, f"file://{tmp_path}", step=100)
    target = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x, tree
    )
    back = cj.load(f"file://{tmp_path}", target=target)
    assert isinstance(back["opt"], AdamState) and isinstance(back["pair"], tuple)
    assert back["params"]["layers"][1] is None
    _same(tree, back)
    doc = json.loads((tmp_path / "step-0000000100/manifest.json").read_bytes())
    assert doc["tensors"]["params/dense/b"]["dtype"] == "bfloat16"
    assert doc["tensors"]["opt/count"]["shape"] == []


def test_pytree_without_target_is_plain_nested_containers(memory_url: str) -> None:
    tree = _tree()
    cj.save(tree, memory_url, step=1)
    plain = cj.load(memory_url)
    assert set(plain["opt"]) == {"count", "mu", "nu"}  # the NamedTuple's fields, by name
    assert isinstance(plain["opt"]["mu"]["w"], jax.Array)
    np.testing.assert_array_equal(
        np.asarray(plain["params"]["layers"][0]), np.asarray(tree["params"]["layers"][0])
    )
    # also readable with plain ckptio (numpy), no jax needed
    assert ckptio.load(memory_url)["opt"]["count"] == 7


def test_target_mismatch_is_named(memory_url: str) -> None:
    cj.save({"w": jnp.zeros((4, 2))}, memory_url, step=1)
    with pytest.raises(
        errors.InvalidArgumentError,
        match=r"\['w'\]: checkpoint has shape \(4, 2\), target \(2, 4\)",
    ):
        cj.load(memory_url, target={"w": jax.ShapeDtypeStruct((2, 4), jnp.float32)})
    with pytest.raises(errors.NotFoundError, match="no leaf at"):
        cj.load(memory_url, target={"v": jax.ShapeDtypeStruct((4, 2), jnp.float32)})
    # jax arrays are immutable: a load cannot fill them in place, and says what to use
    with pytest.raises(
        errors.InvalidArgumentError, match=r"into= at 'w': .*immutable: use ckptio.jax.load"
    ):
        ckptio.load(memory_url, into={"w": jnp.zeros((4, 2))})


def test_cpu_arrays_are_not_copied_and_keys_are_refused() -> None:
    x = jnp.arange(1024, dtype=jnp.float32)
    assert cj.to_numpy(x).ctypes.data == x.unsafe_buffer_pointer()
    with pytest.raises(errors.InvalidArgumentError, match="key_data"):
        cj.to_numpy(jax.random.key(0))


# -- Checkpointer: async saves, retention, resume ----------------------------------------------


def _abstract(tree: object) -> object:
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x, tree
    )


def _at_step(step: int) -> dict:
    tree = _tree()
    tree["params"]["dense"]["w"] = tree["params"]["dense"]["w"] + step
    tree["step"] = step
    return tree


@pytest.mark.parametrize("async_save", [False, True])
def test_checkpointer_saves_pytrees_keeps_the_last_and_loads_its_own_save(
    tmp_path: Path, async_save: bool
) -> None:
    url = f"file://{tmp_path}"
    with cj.Checkpointer(url, async_save=async_save, keep_last=2, retire_grace=0) as ck:
        for step in range(1, 5):
            ck.save(_at_step(step), step=step)
        # its own save in flight is seen: load waits for it
        back = ck.load(target=_abstract(_tree()))
        assert isinstance(back["opt"], AdamState)
        _same(_at_step(4), back)
        assert ck.latest() == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-0000000003", "step-0000000004"]
    again = cj.Checkpointer(url)
    assert again.steps() == [3, 4]
    _same(_at_step(3), again.load(3, target=_abstract(_tree())))
    plain = again.load()
    assert plain["step"] == 4 and isinstance(plain["params"]["dense"]["w"], jax.Array)


KILLED = """
import os, signal, sys
import jax.numpy as jnp
import ckptio.jax as cj
ck = cj.Checkpointer(sys.argv[1], async_save=True, keep_last=2)
for step in range(1, 100):
    handle = ck.save({"w": jnp.full((256, 64), float(step)), "step": step}, step=step)
    if step == 3:
        handle.wait()  # committed: the resume must find at least this step
        with open(sys.argv[2], "w") as f:
            f.write("3")
    if step == 4:
        os.kill(os.getpid(), signal.SIGKILL)  # step 4 in flight
"""


def test_checkpointer_resumes_after_a_sigkill(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = tmp_path / "child.py"
    script.write_text(KILLED)
    url = f"file://{tmp_path}/run"
    proc = subprocess.run(
        [sys.executable, str(script), url, str(tmp_path / "done")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    ck = cj.Checkpointer(url, keep_last=2)
    latest = ck.latest()
    assert latest in (3, 4) and (tmp_path / "done").read_text() == "3"
    back = ck.load(target={"w": jax.ShapeDtypeStruct((256, 64), jnp.float32), "step": 0})
    assert back["step"] == latest
    np.testing.assert_array_equal(
        np.asarray(back["w"]), np.full((256, 64), float(latest), np.float32)
    )
    ck.save(
        {"w": jnp.zeros((256, 64)), "step": latest + 1}, step=latest + 1
    )  # retention and gc of the killed save
    assert ck.steps() == [latest, latest + 1]
    assert sorted(
        p.name for p in (tmp_path / "run").iterdir() if not (p / "retired.json").exists()
    ) == [f"step-{latest:010d}", f"step-{latest + 1:010d}"]


@pytest.mark.parametrize(
    "empty", [None, {}, [], (), {"a": None}, {"a": {}, "b": [None, ()]}], ids=repr
)
def test_nothing_to_save_is_refused(tmp_path: Path, empty: object) -> None:
    url = f"file://{tmp_path}"
    with pytest.raises(errors.InvalidArgumentError, match="nothing to save"):
        cj.save(empty, url, step=1)
    for async_save in (False, True):
        with (
            cj.Checkpointer(url, async_save=async_save) as ck,
            pytest.raises(errors.InvalidArgumentError, match="nothing to save"),
        ):
            ck.save(empty, step=1)
    assert list(tmp_path.iterdir()) == []


def test_tiered_checkpointer_saves_pytrees_on_the_fast_tier_and_drains_them(
    tmp_path: Path,
) -> None:
    """``ckptio.jax.Checkpointer(url, local=...)`` is a tiered one for pytrees: saves commit on
    the fast tier, every 2nd is drained; a restore with the fast tier lost (a replaced node)
    reads the newest drained step from the durable tier, in the target's pytree types."""
    durable, fast = tmp_path / "durable", tmp_path / "fast"
    with cj.Checkpointer(
        f"file://{durable}", local=f"file://{fast}", persist_every=2, retire_grace=0
    ) as ck:
        assert isinstance(ck, cj.Checkpointer) and ck.tiered
        for step in range(1, 5):
            ck.save(_at_step(step), step=step)
        back = ck.load(target=_abstract(_tree()))
        assert isinstance(back["opt"], AdamState)
        _same(_at_step(4), back)  # the newest, from the fast tier
        ck.wait_drains()
        assert ck.tiers()["durable"] == [1, 3]
    with (
        cj.Checkpointer(f"file://{durable}", local=f"file://{fast}") as ck,
        pytest.raises(errors.InvalidArgumentError, match="nothing to save"),
    ):
        ck.save(None, step=9)
    with cj.Checkpointer(f"file://{durable}", local=f"file://{tmp_path / 'new-node'}") as lost:
        _same(_at_step(3), lost.load(target=_abstract(_tree())))


@pytest.mark.parametrize(
    "stored, target, says",
    [
        # a string where an array belongs: returned as it was, or indexed character by character
        (
            {"w": "abc"},
            {"w": (3,)},
            r"tree\['w'\]: the target holds an array here, the checkpoint a str",
        ),
        ({"opt": "xyz"}, {"opt": [(1,)]}, r"tree\['opt'\]: expected a list .*found a str"),
        # a dict where a list belongs, and the other way round
        ({"layers": {"0": np.zeros(2)}}, {"layers": [(2,)]}, r"tree\['layers'\]: expected a list"),
        ({"w": [np.zeros(2)]}, {"w": {"a": (2,)}}, r"tree\['w'\]: expected a dict .*found a list"),
        # a container where an array, or a plain value, belongs
        (
            {"w": {"a": np.zeros(3)}},
            {"w": (3,)},
            r"tree\['w'\]: the target holds an array here, the checkpoint a dict",
        ),
        (
            {"n": [1, 2, 3]},
            {"n": 5},
            r"tree\['n'\]: the target holds an int here, the checkpoint a list",
        ),
    ],
)
def test_a_hostile_tree_is_refused_naming_the_field(memory_url: str, stored, target, says) -> None:
    """A checkpoint (written by anything: here plain ckptio.save) whose structure is not the
    target's: a ManifestError naming where, not a str or dict handed back as an array."""
    ckptio.save({"pad": np.zeros(1), **stored}, memory_url, step=1)

    def spec(leaf):
        return jax.ShapeDtypeStruct(leaf, jnp.float64) if isinstance(leaf, tuple) else leaf

    abstract = jax.tree_util.tree_map(spec, target, is_leaf=lambda x: isinstance(x, tuple))
    with pytest.raises(errors.ManifestError, match=says):
        cj.load(memory_url, target=abstract)
    with pytest.raises(errors.ManifestError, match=says):
        cj.Checkpointer(memory_url).load(target=abstract)
