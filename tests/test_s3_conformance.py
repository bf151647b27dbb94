"""The Store conformance suite for every S3 backend, against a moto server and Ceph RGW the
tests start."""

from __future__ import annotations

from typing import Any

import pytest

from ckptio.registry import open_store
from ckptio.store import Store
from ckptio.testing.moto import MOTO_AND_RGW
from ckptio.testing.store_tests import StoreTests

pytestmark = [pytest.mark.s3, MOTO_AND_RGW]

SMALL_PARTS = {"part_size": "5MiB", "streams": 4}


class S3StoreTests(StoreTests):
    scheme = "s3+boto3"
    options: dict[str, Any] = SMALL_PARTS
    #: 3 parts of 5 MiB and a bit: the multipart path with a short last part
    large_size = 15 * 2**20 + 4321

    @pytest.fixture
    def store(self, s3_bucket: str, s3_client: Any) -> Store:
        self._client = s3_client
        self._bucket = s3_bucket
        st = open_store(f"{self.scheme}://{s3_bucket}/root", **self.options)
        yield st
        st.close()

    def raw_keys(self, store: Store) -> list[str]:
        resp = self._client.list_objects_v2(Bucket=self._bucket)
        return sorted(o["Key"] for o in resp.get("Contents", ()))

    def test_multipart_upload_is_aborted(self, store: Store) -> None:
        w = store.open_writer("mpu/aborted.bin")
        w.write(b"q" * (6 * 2**20))  # more than one part: an upload is started
        w.abort()
        assert self._client.list_multipart_uploads(Bucket=self._bucket).get("Uploads", []) == []
        assert not store.exists("mpu/aborted.bin")

    def test_repr_and_errors_hide_credentials(self, store: Store, s3_env: dict[str, str]) -> None:
        text = repr(store)
        with pytest.raises(FileNotFoundError) as info:
            store.get("missing.bin")
        text += str(info.value)
        for secret in (s3_env["AWS_ACCESS_KEY_ID"], s3_env["AWS_SECRET_ACCESS_KEY"]):
            assert secret not in text


class TestBoto3(S3StoreTests):
    scheme = "s3+boto3"


class TestFsspec(S3StoreTests):
    scheme = "s3+fsspec"


class TestArrow(S3StoreTests):
    scheme = "s3+arrow"


class TestObstore(S3StoreTests):
    scheme = "s3+obstore"


class TestPlainS3(S3StoreTests):
    """``s3://`` resolves to the backend the benchmark found fastest (see README)."""

    scheme = "s3"
