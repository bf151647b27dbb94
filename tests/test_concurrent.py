"""Concurrent writers to the same step: exactly one wins, the other gets a clear error, the
committed checkpoint is entirely the winner's (never a mix), and gc removes the loser's data.

Two processes (forked from a preloaded forkserver) start saving the same step at the same
moment. ``at_publish`` rounds also hold both writers until each has written all its data and
is about to commit, so the create-if-absent commit itself (``O_EXCL``-like ``link`` on POSIX,
``If-None-Match: *`` on S3) decides; free rounds race from the start.
"""

from __future__ import annotations

import pytest

import ckptio
from ckptio import checkpoint as ck
from ckptio.registry import open_store
from ckptio.testing.crash import expected_state, race, state_mismatch
from ckptio.testing.moto import MOTO_AND_RGW


def check_round(url: str, step: int, outcomes: list[tuple[str, str]]) -> int:
    winners = [w for w, (kind, _) in enumerate(outcomes) if kind == "ok"]
    assert len(winners) == 1, outcomes
    (winner,) = winners
    for w, (kind, message) in enumerate(outcomes):
        if w != winner:
            assert kind == "SaveFailedError", outcomes
            assert "already" in message and f"step {step}" in message, message
    reader = ckptio.open_checkpoint(url, step)
    assert reader.metadata == {"writer": winner}
    assert reader.verify() == []
    assert state_mismatch(reader.state(), expected_state(10 * step + winner)) is None
    return winner


def run_rounds(url: str, env=None, rounds: int = 3) -> dict:
    seen = {"free": [], "at_publish": []}
    step = 1
    for kind in ("free", "at_publish"):
        for _ in range(rounds):
            outcomes = race(url, step, at_publish=(kind == "at_publish"), env=env)
            check_round(url, step, outcomes)
            loser = next(m for k, m in outcomes if k != "ok")
            seen[kind].append("commit" if "nothing committed" in loser else "plan")
            step += 1
    # in the at_publish rounds both writers reached the commit: the storage decided
    assert seen["at_publish"] == ["commit"] * rounds, seen
    # the losers' data is debris; gc removes it and leaves every committed step intact
    with open_store(url) as store:
        before = {s: ck.open_checkpoint(store, s).manifest for s in ck.committed_steps(store)}
        removed = ck.collect_garbage(store)
        assert removed, "the losers' data should have been left for gc"
        assert all("/data/" in k for k in removed)
        for s, m in before.items():
            assert ck.open_checkpoint(store, s).manifest == m
            assert ck.open_checkpoint(store, s).verify() == []
        assert ck.collect_garbage(store, unfinished=True, dry_run=True) == []
    return seen


def test_two_writers_same_step_file(tmp_path):
    print(run_rounds(f"file://{tmp_path}/run"))


@pytest.mark.s3
@MOTO_AND_RGW
@pytest.mark.parametrize("scheme", ["s3", "s3+fsspec", "s3+obstore"])
def test_two_writers_same_step_s3(scheme, s3_bucket, s3_env):
    """Every backend that sends If-None-Match (RGW honours it on a PUT, the manifest's only
    request), against moto and RGW: exactly one writer commits each step."""
    print(run_rounds(f"{scheme}://{s3_bucket}/run", env=s3_env, rounds=2))


def test_second_save_of_a_committed_step_is_refused_and_harmless(tmp_path):
    url = f"file://{tmp_path}/run"
    ckptio.save(expected_state(1), url, step=1)
    with pytest.raises(
        ckptio.errors.SaveFailedError, match="step 1 already has a committed checkpoint"
    ):
        ckptio.save(expected_state(2), url, step=1)
    assert state_mismatch(ckptio.load(url, 1), expected_state(1)) is None
    with open_store(url) as store:
        assert ck.collect_garbage(store, unfinished=True, dry_run=True) == []


def test_default_gc_during_a_save_leaves_it_alone(tmp_path):
    """`ckptio gc URL` (default settings) while a save is under way — its data objects
    written, a young temp file beside them, the manifest not yet published — removes nothing
    of it; the save then commits and verifies."""
    import threading

    from ckptio.backends.local import LocalStore

    from ckptio.cli import main

    release = threading.Event()
    at_commit = threading.Event()

    class HeldStore(LocalStore):
        def publish(self, key, data, *, overwrite=True):
            if key.endswith("/manifest.json"):  # (the save's lease is published too)
                at_commit.set()  # every data object is written; the commit waits
                assert release.wait(30)
            super().publish(key, data, overwrite=overwrite)

    url = f"file://{tmp_path}/run"
    ckptio.save(expected_state(1), url, step=1)
    opts = {"chunk_size": 256 * 1024, "max_object_size": 768 * 1024}
    with ckptio.Checkpointer(HeldStore(f"{tmp_path}/run"), async_save=True, **opts) as c:
        handle = c.save(expected_state(2), 2)
        assert at_commit.wait(30)
        with open_store(url) as store:
            w = store.open_writer("step-0000000002/data/rank-00001-000-00000000.bin")
            w.write(b"another rank, still writing")
            w._wait()
            before = store.list("step-0000000002/") + store.list_incomplete("step-0000000002/")
            assert store.list("step-0000000002/") and store.list_incomplete("step-0000000002/")
        assert main(["gc", url]) == 0
        with open_store(url) as store:
            assert (
                store.list("step-0000000002/") + store.list_incomplete("step-0000000002/") == before
            )
        w.abort()
        release.set()
        handle.wait()
    assert ckptio.verify(url, 2) == []
    assert state_mismatch(ckptio.load(url), expected_state(2)) is None
