"""The public :class:`Checkpointer`: one class whatever the tiers and the framework.

It is composed, not chosen by a trick: it holds an *engine* (what writes and reads) and a
*codec* (how a framework's state becomes what ckptio stores, and back; as Orbax's handlers).

- engine: a :class:`~ckptio.checkpoint.checkpointer.StoreCheckpointer` (one store) or, with
  ``local=``, a :class:`~ckptio.checkpoint.tiered.TieredCheckpointer` (a fast tier and a durable
  one, each a one-store engine);
- codec: :class:`PlainCodec` (numpy arrays, ``Shard`` leaves and JSON values as they are) by
  default; :class:`ckptio.torch.TorchCodec` and :class:`ckptio.jax.JaxCodec` for the
  frameworks (``ckptio.torch.Checkpointer`` is this class given that codec).

The lifetime (``close``, a ``with`` block) is :class:`~ckptio.checkpoint.checkpointer.Lifetime`'s,
the same for the facade and both engines.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ckptio import errors
from ckptio.checkpoint.checkpointer import Lifetime, SaveHandle, StoreCheckpointer
from ckptio.checkpoint.commit import SaveResult
from ckptio.checkpoint.read import CheckpointReader
from ckptio.checkpoint.tiered import (
    DrainResult,
    TieredCheckpointer,
    TieredSaveHandle,
    tiered_checkpointer,
)
from ckptio.dist import Communicator
from ckptio.store import Store

__all__ = ["Checkpointer", "Codec", "PlainCodec", "refuse_load_options"]


class Codec(Protocol):
    """How a framework's state is saved and loaded by a :class:`Checkpointer`.

    ``encode(state)``: what ckptio stores (a nested dict/list of numpy-convertible arrays,
    ``Shard`` leaves and JSON values); it must not copy tensors (the snapshot is ckptio's).
    ``decode(read, into=..., **how)``: the framework's state, given ``read(plain_into)``, which
    loads the checkpoint (into ``plain_into``, the encoded form of ``into``, when given);
    ``how`` are the framework's own load options (``target=`` for JAX)."""

    def encode(self, state: Any) -> Any: ...

    def decode(self, read: Callable[[Any], Any], *, into: Any = None, **how: Any) -> Any: ...


def refuse_load_options(how: Mapping[str, Any], codec: str, valid: str = "select, into") -> None:
    """A load option no codec knows is an error naming it (not silently ignored)."""
    if how:
        raise errors.InvalidArgumentError(
            f"load: unknown option(s) {', '.join(sorted(how))} for {codec} state; valid: {valid}"
        )


class PlainCodec:
    """State as ckptio stores it: numpy arrays (and what converts to them), ``Shard`` leaves,
    JSON values."""

    def encode(self, state: Any) -> Any:
        return state

    def decode(self, read: Callable[[Any], Any], *, into: Any = None, **how: Any) -> Any:
        refuse_load_options(how, "numpy")
        return read(into)


class Checkpointer(Lifetime):
    """Saves and loads the checkpoints of one run under ``url``: a storage URL
    (``s3://bucket/prefix``, ``file:///abs/path``, ...), a plain path or ``os.PathLike`` (a
    local directory), or a Store. URLs are parsed strictly
    (:func:`ckptio.registry.parse_url`): a malformed one is refused with the accepted forms.

    - ``local`` (a URL, a URL with ``{rank}``, or one URL per rank): saves every step on that
      fast tier and drains some to ``url`` in the background (``keep_last_local``,
      ``persist_every``, ``drain_backpressure``, ``local_options``, ``replicas``: see
      :class:`~ckptio.checkpoint.tiered.TieredCheckpointer`); ``save`` then returns a
      :class:`~ckptio.checkpoint.tiered.TieredSaveHandle` (with ``wait_drain``).
    - ``codec``: how the state is encoded (default :class:`PlainCodec`; see :class:`Codec`).
    - every other option (``keep_last``, ``async_save``, ``snapshot``, ``comm``, ``layout``,
      ``key_layout``, ``chunk_size``, ``max_object_size``, ``retire_grace``, store options):
      :class:`~ckptio.checkpoint.checkpointer.StoreCheckpointer`.
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | Store,
        *,
        local: Any = None,
        codec: Codec | None = None,
        **options: Any,
    ) -> None:
        self.codec: Codec = codec if codec is not None else PlainCodec()
        self.engine: StoreCheckpointer | TieredCheckpointer = (
            StoreCheckpointer(url, **options)
            if local is None
            else tiered_checkpointer(url, local=local, **options)
        )

    @property
    def tiered(self) -> bool:
        """Whether it saves on a fast tier and drains to ``url`` (``local=`` was given)."""
        return isinstance(self.engine, TieredCheckpointer)

    @property
    def store(self) -> Store:
        """The store under ``url`` (the durable tier's when tiered)."""
        return self.engine.store

    @property
    def comm(self) -> Communicator:
        return self.engine.comm

    @property
    def async_save(self) -> bool:
        engine = self.engine
        return (engine.fast if isinstance(engine, TieredCheckpointer) else engine).async_save

    @property
    def keep_last(self) -> int | None:
        """Checkpoints kept under ``url`` (the durable tier's when tiered)."""
        engine = self.engine
        return (engine.durable if isinstance(engine, TieredCheckpointer) else engine).keep_last

    # -- saving -----------------------------------------------------------------------------
    def save(
        self, state: Any, step: int, *, metadata: Any = None, blocking: bool | None = None
    ) -> SaveHandle | TieredSaveHandle:
        """Save ``state`` as ``step``. Blocking: returns when committed (on the fast tier when
        tiered). Async: returns after the snapshot; ``handle.wait()`` (or the next
        ``save``/``wait``) gives the outcome. ``step``: any integral
        (:func:`ckptio.format.as_step`). Every rank calls it together."""
        return self.engine.save(
            self.codec.encode(state), step, metadata=metadata, blocking=blocking
        )

    def wait(self) -> SaveResult | None:
        """Wait for the save in flight (and, when tiered, the drains); raise its error if it
        failed, unless its handle's ``wait`` raised it already."""
        return self.engine.wait()

    def wait_drains(self) -> list[DrainResult]:
        """Wait for the drains queued or running; their results (none without ``local``)."""
        engine = self.engine
        return engine.wait_drains() if isinstance(engine, TieredCheckpointer) else []

    # -- loading ----------------------------------------------------------------------------
    def load(
        self,
        step: int | None = None,
        *,
        select: Mapping[str, Any] | None = None,
        into: Any = None,
        **how: Any,
    ) -> Any:
        """The state of ``step`` (default: the newest complete checkpoint), decoded by the
        codec; ``select`` and ``into`` as for :func:`ckptio.load`; ``how``: the codec's own
        options (``target=`` for JAX)."""
        engine = self.engine
        return self.codec.decode(
            lambda plain_into: engine.load(step, select=select, into=plain_into), into=into, **how
        )

    def steps(self) -> list[int]:
        """Committed steps, ascending (on either tier when tiered: this rank's fast root)."""
        return self.engine.steps()

    def latest(self) -> int | None:
        """The step :meth:`load` would read, or None."""
        return self.engine.latest()

    def tiers(self) -> dict[str, list[int]]:
        """Committed steps per tier: ``{"local": [...], "durable": [...]}`` when tiered,
        ``{"durable": [...]}`` otherwise."""
        engine = self.engine
        if isinstance(engine, TieredCheckpointer):
            return engine.tiers()
        return {"durable": engine.steps()}

    def open(self, step: int | None = None) -> CheckpointReader:
        """A reader of ``step`` (default the newest) under ``url``. Not when tiered: which tier
        a rank reads is agreed by every rank in :meth:`load`."""
        engine = self.engine
        if isinstance(engine, TieredCheckpointer):
            raise errors.InvalidArgumentError(
                "open(): a tiered Checkpointer reads through load(), which picks each rank's tier"
            )
        return engine.open(step)

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for the save in flight (and drains), raising its failure, and release the
        engine's resources (threads, snapshot memory, the stores it opened). Closing twice is
        harmless."""
        self.engine.close()
