"""What ranks send each other in a collective: JSON, never pickle (ckptio.wire), through every
communicator: a load never unpickles, not even what another rank of the job sent."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from ckptio.wire import decode, encode


class _Runs:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.touch, (self.path,))


def test_a_pickle_on_the_wire_is_refused_and_never_run(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    payload = pickle.dumps(_Runs(ran))
    with pytest.raises(ValueError):
        decode(payload)
    assert not ran.exists()


def test_objects_json_cannot_hold_are_refused_not_pickled() -> None:
    assert decode(encode({"step": 3, "plan": (1, 2), 7: None})) == {
        "step": 3,
        "plan": [1, 2],
        "7": None,
    }
    for obj in ({1, 2}, object(), b"bytes"):
        with pytest.raises(TypeError):
            encode(obj)


def test_the_mpi_communicator_sends_json() -> None:
    """One MPI rank (no launcher): its gather and bcast go through the same encoding; they
    pickled before (a set went through)."""
    pytest.importorskip("mpi4py")
    from ckptio.dist import MPICommunicator

    comm = MPICommunicator()
    assert comm.gather({"a": (1, 2)}) == [{"a": [1, 2]}]
    with pytest.raises(TypeError):
        comm.gather({1, 2})
    with pytest.raises(TypeError):
        comm.bcast({1, 2})
