"""Cold reads: how a run's restore makes its reads miss the page cache of this machine, with
the store's cold-read modes (:class:`~ckptio.store.ColdReads` of its description), or by
dropping the caches (root)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ckptio import errors
from ckptio import format as fmt
from ckptio.store import Store

__all__ = ["CACHE_MODES", "check_cache", "start_cold_reads", "valid_modes"]

CACHE_MODES = ("auto", "o_direct", "fadvise", "drop_caches", "none")
"""How the restore bypasses the page cache. ``auto``: O_DIRECT where the store can read that
way, else ``posix_fadvise(DONTNEED)`` of each object (the store's
:attr:`~ckptio.store.ColdReads.modes` of its description); stores without a local page cache (object
stores, memory) record ``n/a``."""


def start_cold_reads(store: Store, step: int, keys: Sequence[str], cache: str) -> str:
    """Make the coming reads miss the page cache; return how (a :data:`CACHE_MODES` value
    other than auto, or ``n/a`` for stores without a local page cache). The store's
    :meth:`ColdReads.end <ckptio.store.ColdReads.end>` follows the reads."""
    prefix = fmt.step_dir(step) + "/"
    cold = store.describe().cold_reads
    modes = cold.modes
    has_direct, has_fadvise = "o_direct" in modes, "fadvise" in modes
    if cache == "none":
        return "none"
    if cache in ("auto", "o_direct") and has_direct:
        return cold.start([prefix + k for k in keys], "o_direct")
    if cache == "o_direct":
        raise errors.InvalidArgumentError(
            f"{store.name}:// cannot read with O_DIRECT; "
            f"valid cache modes here: {valid_modes(store)}"
        )
    if cache in ("auto", "fadvise") and has_fadvise:
        done = cold.start([prefix + k for k in keys], "fadvise")
        if done:
            return done  # "fadvise", or "none": only some objects could be dropped
        has_fadvise = False  # e.g. an emulated store over memory: no page cache to drop
    if cache == "drop_caches":
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
        except OSError as err:
            raise errors.StoragePermissionError(
                f"cannot drop the page cache ({err}); it needs root. Valid cache modes here: "
                f"{valid_modes(store)}"
            ) from err
        return "drop_caches"
    if cache == "fadvise":
        raise errors.InvalidArgumentError(
            f"{store.name}:// has no local page cache to advise; "
            f"valid cache modes here: {valid_modes(store)}"
        )
    return "n/a" if not (has_direct or has_fadvise) else "none"


def check_cache(store: Store, cache: str) -> None:
    """Raise :class:`~ckptio.errors.InvalidArgumentError` unless ``store`` can bypass the
    page cache as ``cache`` says (the same verdict on every rank, before any collective)."""
    modes = store.describe().cold_reads.modes
    if cache == "o_direct" and "o_direct" not in modes:
        raise errors.InvalidArgumentError(
            f"{store.name}:// cannot read with O_DIRECT; "
            f"valid cache modes here: {valid_modes(store)}"
        )
    if cache == "fadvise" and "fadvise" not in modes:
        raise errors.InvalidArgumentError(
            f"{store.name}:// has no local page cache to advise; "
            f"valid cache modes here: {valid_modes(store)}"
        )


def valid_modes(store: Store) -> str:
    """The cache modes ``store`` offers, in words (for the errors above)."""
    modes = ["auto", "none"]
    offered = store.describe().cold_reads.modes
    if "o_direct" in offered:
        modes.append("o_direct")
    if "fadvise" in offered:
        modes.append("fadvise")
    modes.append("drop_caches (root)")
    return ", ".join(modes)
