"""JAX: arrays in ckptio checkpoints, and pytree save / load.

::

    import ckptio.jax
    ckptio.jax.save({"params": params, "opt_state": opt_state, "step": 100}, "s3://b/run", step=100)
    restored = ckptio.jax.load("s3://b/run", target=abstract_state)   # same pytree types back

- ``to_numpy``: a ``jax.Array`` that this process can address fully becomes a numpy array;
  on the CPU backend ``np.asarray`` hands out the device buffer itself (no copy; read-only),
  on accelerators it is one device-to-host transfer. bfloat16 / float8 are ml_dtypes dtypes
  in JAX already, so they need no conversion.
- ``save``: any pytree (dicts, lists, tuples, None, NamedTuples, dataclasses and other
  registered nodes such as optax states) is stored as plain nested dicts and lists built from
  JAX's key paths (``DictKey`` / ``GetAttrKey`` -> dict key, ``SequenceKey`` /
  ``FlattenedIndexKey`` -> list index). JSON values (ints, floats, strings) stay JSON.
- ``Checkpointer``: the same with ``keep_last`` retention and ``async_save`` (see its
  docstring); ``save`` and ``Checkpointer.save`` refuse a pytree with no leaves (None, empty
  containers) instead of committing an empty checkpoint. ``Checkpointer(url, local=...)`` is
  tiered: saves on a fast tier drained to ``url`` (:mod:`ckptio.checkpoint.tiered`), pytrees
  in and ``jax.Array`` leaves out as here. It is :class:`ckptio.Checkpointer` given a
  :class:`JaxCodec`.
- ``load``: without ``target``, that plain structure with ``jax.Array`` leaves. With
  ``target`` (a pytree of the same structure: arrays, ``jax.ShapeDtypeStruct`` or anything
  with ``shape``/``dtype``), the target's own node types come back, every leaf is checked
  against the target's shape and dtype, and arrays are placed with the target leaf's
  ``sharding`` (Orbax-style restore).

Not handled here: arrays sharded over several processes (``is_fully_addressable`` False) —
save each process's shards as :class:`ckptio.Shard` leaves instead. Typed PRNG keys are
refused; store ``jax.random.key_data(key)`` and rebuild with ``jax.random.wrap_key_data``.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ckptio import checkpoint as _ck
from ckptio import errors
from ckptio.checkpoint.facade import refuse_load_options
from ckptio.store import Store

__all__ = ["Checkpointer", "JaxCodec", "load", "save", "to_numpy"]


def to_numpy(obj: Any) -> np.ndarray | None:
    """A ``jax.Array`` as a numpy array in host memory, or None if ``obj`` is not one."""
    import jax

    if not isinstance(obj, jax.Array):
        return None
    if jax.dtypes.issubdtype(obj.dtype, jax.dtypes.prng_key):
        raise errors.InvalidArgumentError(
            "typed PRNG keys cannot be checkpointed as arrays; store jax.random.key_data(key) "
            "and restore with jax.random.wrap_key_data"
        )
    if not obj.is_fully_addressable:
        raise errors.InvalidArgumentError(
            "a jax.Array sharded across processes is not fully addressable here; save each "
            "process's addressable shards as ckptio.Shard(shard.data, global_shape, offsets)"
        )
    return np.asarray(obj)


# -- pytrees <-> plain nested containers ------------------------------------------------------


def _entry(key: Any) -> tuple[str, Any]:
    """("d", name) for a dict-like step of a key path, ("l", index) for a sequence-like one."""
    import jax

    tu = jax.tree_util
    if isinstance(key, tu.DictKey):
        k = key.key
        if not isinstance(k, str):
            raise errors.InvalidArgumentError(
                f"pytree dict key {k!r} ({type(k).__name__}) is not a string; ckptio stores string keys"
            )
        return "d", k
    if isinstance(key, tu.GetAttrKey):
        return "d", key.name
    if isinstance(key, tu.SequenceKey):
        return "l", key.idx
    if isinstance(key, tu.FlattenedIndexKey):
        return "l", key.key
    raise errors.InvalidArgumentError(f"unsupported pytree key {key!r}")


def _plain(tree: Any) -> Any:
    """The pytree as nested dicts / lists (lists may have gaps where a subtree was empty)."""
    import jax

    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    if not leaves:
        return {}
    if len(leaves) == 1 and leaves[0][0] == ():
        return leaves[0][1]
    root: dict[Any, Any] = {}
    kinds: dict[int, str] = {}

    def container(parent: dict[Any, Any], key: Any, kind: str) -> dict[Any, Any]:
        child = parent.get(key)
        if child is None:
            child = parent[key] = {}
            kinds[id(child)] = kind
        return child

    for path, leaf in leaves:
        node = root
        steps = [_entry(k) for k in path]
        kinds.setdefault(id(root), steps[0][0])
        for (_kind, key), (next_kind, _) in itertools.pairwise(steps):
            node = container(node, key, next_kind)
        node[steps[-1][1]] = leaf

    def finish(node: dict[Any, Any]) -> Any:
        kind = kinds[id(node)]
        items = {
            k: finish(v) if isinstance(v, dict) and id(v) in kinds else v for k, v in node.items()
        }
        if kind == "d":
            return items
        out = [None] * (max(items) + 1)
        for i, v in items.items():
            out[i] = v
        return out

    return finish(root)


def _lookup(plain: Any, path: tuple[Any, ...]) -> Any:
    """The value at ``path`` (a target's key path) in the loaded plain tree: a dict where the
    target has a dict-like node, a list where it has a sequence. Anything else there (a
    string, say, which would otherwise be indexed character by character) is damage, refused
    with :class:`~ckptio.errors.ManifestError` naming the place."""
    node = plain
    for depth, k in enumerate(path):
        kind, key = _entry(k)
        if not isinstance(node, dict if kind == "d" else list | tuple):
            where = "tree" + "".join(f"[{_entry(p)[1]!r:.60}]" for p in path[:depth])
            raise errors.ManifestError(
                f"expected a {'dict' if kind == 'd' else 'list'} (the target's structure), "
                f"found a {type(node).__name__}",
                field=where,
            )
        try:
            node = node[key]
        except (KeyError, IndexError):
            where = "".join(f"[{_entry(p)[1]!r}]" for p in path)
            raise errors.NotFoundError(f"the checkpoint has no leaf at {where}") from None
    return node


def _plain_to_save(tree: Any) -> Any:
    """The plain form of a pytree to save; a pytree with no leaves is refused."""
    import jax

    if not jax.tree_util.tree_leaves(tree):
        what = "None" if tree is None else f"a {type(tree).__name__} with no leaves"
        raise errors.InvalidArgumentError(
            f"nothing to save: the pytree is {what} (None and empty containers are not leaves "
            "in JAX); pass the state to checkpoint, not the result of a function that returns None"
        )
    return _plain(tree)


def save(
    tree: Any, url: str | os.PathLike[str] | Store, step: int, **options: Any
) -> _ck.SaveHandle:
    """Save a pytree as ``step`` under ``url`` (options as :func:`ckptio.save`); a pytree
    with no leaves (None, empty containers) is refused."""
    return _ck.save(_plain_to_save(tree), url, step, **options)


def _place(value: Any, like: Any, path: str) -> Any:
    import jax

    shape, dtype = getattr(like, "shape", None), getattr(like, "dtype", None)
    if isinstance(value, np.generic) and shape is not None:
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        # a damaged or hostile checkpoint: a container, or a plain value where an array belongs
        if shape is not None or isinstance(value, dict | list | tuple):
            name = "array" if shape is not None else type(like).__name__
            want = f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
            raise errors.ManifestError(
                f"the target holds {want} here, the checkpoint a {type(value).__name__}",
                field=f"tree{path}",
            )
        return value
    if shape is not None and tuple(shape) != value.shape:
        raise errors.InvalidArgumentError(
            f"{path}: checkpoint has shape {value.shape}, target {tuple(shape)}"
        )
    if dtype is not None and np.dtype(dtype) != value.dtype:
        raise errors.InvalidArgumentError(
            f"{path}: checkpoint has dtype {value.dtype}, target {np.dtype(dtype)}"
        )
    if isinstance(like, np.ndarray):
        return value
    sharding = getattr(like, "sharding", None)
    return jax.device_put(value, sharding) if sharding is not None else jax.device_put(value)


def load(
    url: str | os.PathLike[str] | Store,
    step: int | None = None,
    *,
    target: Any = None,
    select: Mapping[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Load a pytree saved by :func:`save` (step: default the newest). See the module doc."""
    return _restore(_ck.load(url, step, select=select, **options), target)


def _restore(plain: Any, target: Any) -> Any:
    """The loaded plain structure as ``jax.Array`` leaves, shaped like ``target`` if given."""
    import jax

    if target is None:
        return jax.tree_util.tree_map(
            lambda v: jax.device_put(v) if isinstance(v, np.ndarray) else v, plain
        )
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
    out = []
    for path, like in leaves:
        value = _lookup(plain, path)
        out.append(_place(value, like, jax.tree_util.keystr(path)))
    return jax.tree_util.tree_unflatten(treedef, out)


class JaxCodec:
    """How JAX pytrees are saved and loaded by a :class:`ckptio.Checkpointer`: ``save`` takes
    any pytree (as :func:`save`: one with no leaves is refused), ``load`` returns ``jax.Array``
    leaves, in ``target``'s structure, shapes, dtypes and shardings when given (as
    :func:`load`); not ``into`` (jax arrays are immutable)."""

    def encode(self, state: Any) -> Any:
        return _plain_to_save(state)

    def decode(
        self, read: Callable[[Any], Any], *, into: Any = None, target: Any = None, **how: Any
    ) -> Any:
        if into is not None:
            raise errors.InvalidArgumentError(
                "load: into= fills arrays in place, and jax arrays are immutable; give target="
            )
        refuse_load_options(how, "JAX", "select, target")
        return _restore(read(None), target)


class Checkpointer(_ck.Checkpointer):
    """:class:`ckptio.Checkpointer` given a :class:`JaxCodec`, for JAX pytrees: the same
    options and contract
    (``keep_last`` retention, ``async_save`` with one snapshot copy and the failure reported
    once, ``wait``/``steps``/``latest``/``close``, a ``with`` block), with ``save`` taking any
    pytree (as :func:`save`: a pytree with no leaves is refused) and ``load`` returning
    ``jax.Array`` leaves, in ``target``'s structure, shapes, dtypes and shardings when given
    (as :func:`load`)::

        with ckptio.jax.Checkpointer("s3://bucket/run", async_save=True, keep_last=3) as ck:
            for step in range(start, steps):
                state = train_step(state)
                if step % 1000 == 0:
                    ck.save(state, step=step)
        state = ck.load(target=abstract_state)     # the newest checkpoint

    With ``local=...`` it is tiered (saves on a fast tier drained to ``url``), as
    :class:`ckptio.Checkpointer` is. Single process: arrays sharded over several processes are
    not fully addressable here (see the module docstring).
    """

    def __init__(self, url: str | os.PathLike[str] | Store, **options: Any) -> None:
        super().__init__(url, codec=JaxCodec(), **options)


def __getattr__(name: str) -> Any:
    if name == "TieredCheckpointer":  # before the codec, a twin class of Checkpointer
        warnings.warn(
            "ckptio.jax.TieredCheckpointer is deprecated: ckptio.jax.Checkpointer(url, "
            "local=...) is tiered",
            DeprecationWarning,
            stacklevel=2,
        )
        return Checkpointer
    raise AttributeError(f"module 'ckptio.jax' has no attribute {name!r}")
