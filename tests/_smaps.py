"""/proc/self/smaps figures of one memory mapping (Linux), for tests of page handling."""

from __future__ import annotations

from pathlib import Path


def _mapping(addr: int) -> tuple[int, int, list[str]]:
    """The start, end and smaps lines (up to and including ``VmFlags``) of the mapping that
    holds ``addr``."""
    text = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(text):
        head = line.split(" ", 1)[0]
        if "-" in head and line[:1] in "0123456789abcdef":
            lo, hi = (int(x, 16) for x in head.split("-"))
            if lo <= addr < hi:
                entries = []
                for entry in text[i + 1 :]:
                    entries.append(entry)
                    if entry.startswith("VmFlags"):
                        break
                return lo, hi, entries
    raise AssertionError("mapping not found")


def mapping_kib(addr: int, nbytes: int, *fields: str) -> int:
    """The sum of ``fields`` (``"Rss"``, ``"Shared_Clean"``, ...), in KiB, of the mapping that
    starts at ``addr`` and is ``nbytes`` long. Fails if the kernel merged it with neighbours
    (give it a flag they lack, such as ``MADV_DONTDUMP``) or if there is no such mapping."""
    lo, hi, entries = _mapping(addr)
    assert (lo, hi) == (addr, addr + nbytes), "the mapping merged with its neighbours"
    wanted = tuple(f"{f}:" for f in fields)
    return sum(int(e.split()[1]) for e in entries if e.startswith(wanted))


def mapping_flags(addr: int) -> set[str]:
    """The ``VmFlags`` (``hg``: MADV_HUGEPAGE, ``dc``: MADV_DONTFORK, ...) of the mapping that
    holds ``addr``."""
    return {f for e in _mapping(addr)[2] if e.startswith("VmFlags:") for f in e.split()[1:]}
