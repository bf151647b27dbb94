"""The save protocol's requests, counted for the models (:mod:`ckptio.stallmodel`,
:mod:`ckptio.simulate`): a module of its own, importing nothing, so that ``ckptio model``
does not load numpy with :mod:`ckptio.format`."""

from __future__ import annotations

__all__ = ["LIST_PAGE", "save_protocol_requests"]

LIST_PAGE = 1000
"""Keys a listing returns per request: S3's ListObjectsV2 returns at most 1,000 (Amazon S3 API
Reference, ListObjectsV2, MaxKeys)."""


def save_protocol_requests(objects: int) -> int:
    """The requests in series of a save's protocol besides its objects' own
    (:mod:`ckptio.checkpoint.commit`, docs/guarantees.md): before the first byte the save's
    lease is published while the step's manifest is checked absent (two requests at once: one
    round trip); after the last byte the manifest is published, the step listed (``objects``,
    the manifest and the lease: one request per :data:`LIST_PAGE` keys) to find a gc's fence
    or a missing object, and the lease released (a delete). A gc's fence costs the gc, not the
    save."""
    return 1 + 2 + -(-(objects + 2) // LIST_PAGE)
