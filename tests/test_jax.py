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
    return {"params": params, "opt": opt, "step": 100, "lr": 0.5, "name": "run-1", "pair": (w[0], 3)}


def _same(a: object, b: object) -> None:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, jax.Array):
            assert isinstance(y, jax.Array) and x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(np.asarray(x).reshape(-1).view(np.uint8), np.asarray(y).reshape(-1).view(np.uint8))
        else:
            assert x == y and type(x) is type(y)


def test_pytree_round_trip_with_target(tmp_path: Path) -> None:
    tree = _tree()
    cj.save(tree, f"file://{tmp_path}", step=100)
    target = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x, tree)
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
    np.testing.assert_array_equal(np.asarray(plain["params"]["layers"][0]), np.asarray(tree["params"]["layers"][0]))
    # also readable with plain ckptio (numpy), no jax needed
    assert ckptio.load(memory_url)["opt"]["count"] == 7


def test_target_mismatch_is_named(memory_url: str) -> None:
    cj.save({"w": jnp.zeros((4, 2))}, memory_url, step=1)
    with pytest.raises(errors.InvalidArgumentError, match=r"\['w'\]: checkpoint has shape \(4, 2\), target \(2, 4\)"):
        cj.load(memory_url, target={"w": jax.ShapeDtypeStruct((2, 4), jnp.float32)})
    with pytest.raises(errors.NotFoundError, match="no leaf at"):
        cj.load(memory_url, target={"v": jax.ShapeDtypeStruct((4, 2), jnp.float32)})
    # jax arrays are immutable: a load cannot fill them in place, and says what to use
    with pytest.raises(errors.InvalidArgumentError, match=r"into= at 'w': .*immutable: use ckptio.jax.load"):
        ckptio.load(memory_url, into={"w": jnp.zeros((4, 2))})


def test_cpu_arrays_are_not_copied_and_keys_are_refused() -> None:
    x = jnp.arange(1024, dtype=jnp.float32)
    assert cj.to_numpy(x).ctypes.data == x.unsafe_buffer_pointer()
    with pytest.raises(errors.InvalidArgumentError, match="key_data"):
        cj.to_numpy(jax.random.key(0))
