"""ckptio.testing.rgw: a Ceph RGW on loopback starts, serves S3, and stops leaving nothing
behind; where its packages are missing the fixture skips with the install hint, and fails
under CI=true."""

from __future__ import annotations

import os

import pytest

from ckptio.testing import rgw


def _skip_unless_installed() -> None:
    reason = rgw.unavailable_reason()
    if reason:
        if rgw.in_ci():
            pytest.fail(f"Ceph RGW is missing in CI: {reason}", pytrace=False)
        pytest.skip(reason)


@pytest.mark.rgw
def test_start_serve_stop_leaves_nothing(tmp_path) -> None:
    _skip_unless_installed()
    work = tmp_path / "rgw"
    server = rgw.start_rgw(work)
    try:
        assert sorted(server.pids) == ["client.rgw", "mon.a", "osd.0"]
        client = server.client()
        client.create_bucket(Bucket="ckptio-b")
        client.put_object(Bucket="ckptio-b", Key="k", Body=b"v")
        assert client.get_object(Bucket="ckptio-b", Key="k")["Body"].read() == b"v"
        rgw.empty_bucket(client, "ckptio-b")
        assert "ckptio-b" not in [b["Name"] for b in client.list_buckets()["Buckets"]]
        client.close()
    finally:
        problems = rgw.stop_rgw(server)
    assert problems == []
    for pid in server.pids.values():  # every daemon gone, the OSD (deaf to SIGTERM) too
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not work.exists()


def test_a_directory_holding_anything_is_refused(tmp_path) -> None:
    _skip_unless_installed()
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(rgw.RgwUnavailable, match="not empty"):
        rgw.start_rgw(tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_missing_packages_skip_with_the_hint_and_fail_in_ci(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    reason = rgw.unavailable_reason()
    assert reason and "apt-get install --no-install-recommends radosgw ceph-mon ceph-osd" in reason
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="radosgw"):
        next(rgw.server_or_skip())
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="could not be started in CI"):
        next(rgw.server_or_skip())
