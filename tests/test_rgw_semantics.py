"""Where Ceph RGW and moto answer differently, measured side by side, and what ckptio does about
each difference — asserted on ckptio's behaviour, never on the server's.

Each test first measures the server's raw answer with boto3 (printed with ``-s``, and kept in
the test's ``record_property`` as ``server``) and then checks ckptio on the same server:

- CompleteMultipartUpload with ``If-None-Match: *`` on an existing key: RGW 16 ignores the
  condition and overwrites (moto: 412). ckptio's create-if-absent (the manifest) is one PUT
  whatever its size, which both refuse: a second commit of a step is refused.
- The CompleteMultipartUpload response's ``ETag``: empty on RGW. ckptio does not use it: sizes
  come from HEAD, integrity from the manifest's CRC32C per chunk.
- A wrong ``Content-MD5``: 400 BadDigest on RGW (moto accepts it); a wrong
  ``x-amz-checksum-crc32c``: accepted unchecked by both. ckptio takes BadDigest as damage in
  flight (retried), and finds a corrupted object at load through the manifest's CRC32C.
- ``list_parts`` after an abort: NoSuchKey on RGW, NoSuchUpload on moto; CompleteMultipartUpload
  after an abort: 500 on both. ckptio: an aborted write leaves nothing; a write whose upload a
  janitor aborted fails with an error naming the key and leaves nothing.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import numpy as np
import pytest
from ckptio.backends import _s3errors

import ckptio
from ckptio import errors
from ckptio import format as fmt
from ckptio.registry import open_store
from ckptio.store import RetryPolicy
from ckptio.testing.moto import MOTO_AND_RGW, S3Target

pytestmark = [pytest.mark.s3, MOTO_AND_RGW]

CONDITIONAL = ["s3+boto3", "s3+fsspec", "s3+obstore"]
"""Backends that send ``If-None-Match: *`` (s3+arrow cannot: its create is check-then-PUT)."""
BACKENDS = [*CONDITIONAL, "s3+arrow"]
PART = 5 * 2**20
FAST_RETRIES = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05)


def _answer(fn: Any) -> str:
    """The server's answer to one raw request: ``ok`` or ``<Code> <HTTP status>``."""
    try:
        fn()
    except Exception as err:
        code, status = _s3errors.error_details(err)
        return f"{code} {status}"
    return "ok"


@pytest.fixture
def raw(s3_target: S3Target) -> Any:
    """A boto3 client that sends each request once (no botocore retries): the server's answer."""
    import boto3
    from botocore.config import Config

    from ckptio.testing.motoserver import TEST_ACCESS_KEY_ID, TEST_REGION, TEST_SECRET_ACCESS_KEY

    client = boto3.client(
        "s3",
        endpoint_url=s3_target.endpoint,
        region_name=TEST_REGION,
        aws_access_key_id=TEST_ACCESS_KEY_ID,
        aws_secret_access_key=TEST_SECRET_ACCESS_KEY,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )
    yield client
    client.close()


def _record(record_property: Any, target: S3Target, what: str, answer: str) -> None:
    print(f"{target.name}: {what}: {answer}")
    record_property("server", f"{what}: {answer}")


def _mpu(client: Any, bucket: str, key: str, nparts: int = 1) -> tuple[str, list[dict[str, Any]]]:
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts = []
    for n in range(1, nparts + 1):
        etag = client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload, PartNumber=n, Body=bytes([n]) * PART
        )["ETag"]
        parts.append({"PartNumber": n, "ETag": etag})
    return upload, parts


# -- the one-writer-per-step check -------------------------------------------------------------


def test_conditional_complete_is_not_relied_on(
    s3_target: S3Target, s3_bucket: str, s3_client: Any, record_property: Any
) -> None:
    s3_client.put_object(Bucket=s3_bucket, Key="raw/k", Body=b"first")
    upload, parts = _mpu(s3_client, s3_bucket, "raw/k")
    answer = _answer(
        lambda: s3_client.complete_multipart_upload(
            Bucket=s3_bucket,
            Key="raw/k",
            UploadId=upload,
            MultipartUpload={"Parts": parts},
            IfNoneMatch="*",
        )
    )
    kept = s3_client.get_object(Bucket=s3_bucket, Key="raw/k")["Body"].read() == b"first"
    _record(
        record_property,
        s3_target,
        "CompleteMultipartUpload If-None-Match on an existing key",
        f"{answer}, {'kept' if kept else 'overwritten'}",
    )
    put = _answer(
        lambda: s3_client.put_object(Bucket=s3_bucket, Key="raw/k", Body=b"x", IfNoneMatch="*")
    )
    _record(record_property, s3_target, "PUT If-None-Match on an existing key", put)

    # ckptio: a create-if-absent larger than several parts is still one PUT, and refused
    for scheme in CONDITIONAL:
        with open_store(f"{scheme}://{s3_bucket}/{scheme}", part_size="5MiB") as store:
            big = b"m" * (3 * PART + 17)
            store.publish("manifest.json", big, overwrite=False)
            head = s3_client.head_object(Bucket=s3_bucket, Key=f"{scheme}/manifest.json")
            assert "-" not in head["ETag"].strip('"'), f"{scheme}: a multipart upload, not one PUT"
            with pytest.raises(errors.AlreadyExistsError):
                store.publish("manifest.json", b"n" * len(big), overwrite=False)
            assert store.get("manifest.json") == big, scheme


@pytest.mark.parametrize("scheme", BACKENDS)
def test_a_second_commit_of_a_step_is_refused(scheme: str, s3_bucket: str) -> None:
    url = f"{scheme}://{s3_bucket}/run?part_size=5MiB"
    first = {"w": np.arange(3 * PART // 4, dtype=np.float32)}  # 3 parts: a multipart object
    ckptio.save(first, url, step=1)
    with pytest.raises(errors.CkptioError) as info:
        ckptio.save({"w": first["w"] + 1}, url, step=1)
    assert "exist" in str(info.value).lower() or "committed" in str(info.value).lower(), info.value
    assert np.array_equal(ckptio.load(url, step=1)["w"], first["w"])


@pytest.mark.parametrize("scheme", BACKENDS)
def test_lease_overwrite_publish(scheme: str, s3_bucket: str) -> None:
    """The save lease is republished in place (``overwrite=True``) while a save runs."""
    with open_store(f"{scheme}://{s3_bucket}/lease") as store:
        store.publish("step-0000000001/saving-x.json", b"one", overwrite=True)
        store.publish("step-0000000001/saving-x.json", b"two", overwrite=True)
        assert store.get("step-0000000001/saving-x.json") == b"two"


# -- multipart ETag and size -------------------------------------------------------------------


@pytest.mark.parametrize("scheme", BACKENDS)
def test_multipart_object_size_and_content(
    scheme: str, s3_target: S3Target, s3_bucket: str, s3_client: Any, record_property: Any
) -> None:
    upload, parts = _mpu(s3_client, s3_bucket, "raw/mpu", nparts=2)
    resp = s3_client.complete_multipart_upload(
        Bucket=s3_bucket, Key="raw/mpu", UploadId=upload, MultipartUpload={"Parts": parts}
    )
    head = s3_client.head_object(Bucket=s3_bucket, Key="raw/mpu")
    _record(
        record_property,
        s3_target,
        "CompleteMultipartUpload ETag / HEAD ETag",
        f"{resp.get('ETag')!r} / {head['ETag']!r}",
    )

    url = f"{scheme}://{s3_bucket}/ck?part_size=5MiB"
    state = {"w": np.random.default_rng(1).standard_normal(2 * PART // 8 + 123)}  # 2+ parts
    ckptio.save(state, url, step=1)
    assert ckptio.verify(url) == []
    assert np.array_equal(ckptio.load(url)["w"], state["w"])
    with open_store(url) as store:
        manifest = ckptio.checkpoint.read_manifest(store, 1)
        for key in manifest.objects:
            full = f"ck/{fmt.step_dir(1)}/{key}"
            assert (
                store.size(f"{fmt.step_dir(1)}/{key}")
                == s3_client.head_object(Bucket=s3_bucket, Key=full)["ContentLength"]
            )


# -- integrity ---------------------------------------------------------------------------------


def test_wrong_checksums_and_a_corrupted_object(
    s3_target: S3Target, s3_bucket: str, raw: Any, record_property: Any
) -> None:
    s3_client = raw
    wrong_md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    md5 = _answer(
        lambda: s3_client.put_object(
            Bucket=s3_bucket, Key="raw/md5", Body=b"abc", ContentMD5=wrong_md5
        )
    )
    crc = _answer(
        lambda: s3_client.put_object(
            Bucket=s3_bucket, Key="raw/crc", Body=b"abc", ChecksumCRC32C="AAAAAA=="
        )
    )
    _record(record_property, s3_target, "PUT with a wrong Content-MD5", md5)
    _record(record_property, s3_target, "PUT with a wrong x-amz-checksum-crc32c", crc)

    # ckptio: BadDigest is damage in flight, resent (retried), never a permanent failure
    try:
        s3_client.put_object(Bucket=s3_bucket, Key="raw/md5", Body=b"abc", ContentMD5=wrong_md5)
    except Exception as err:
        assert isinstance(
            _s3errors.translate_error(err, action="write", key="k", where="w"),
            errors.TransientStorageError,
        )
    # and an object damaged anyway (the server accepted what it did not check) is found at load
    url = f"s3://{s3_bucket}/run"
    ckptio.save({"w": np.arange(4096, dtype=np.float32)}, url, step=1)
    with open_store(url) as store:
        key = next(k for k in store.list(fmt.step_dir(1)) if "/data/" in k)
        data = bytearray(store.get(key))
        data[100] ^= 0xFF
        store.put(key, bytes(data))  # same size, one byte flipped
    with pytest.raises(errors.ChecksumError):
        ckptio.load(url, step=1)
    assert ckptio.verify(url, step=1)


# -- aborts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", BACKENDS)
def test_abort_leaves_nothing(
    scheme: str, s3_target: S3Target, s3_bucket: str, s3_client: Any, record_property: Any
) -> None:
    upload, _ = _mpu(s3_client, s3_bucket, "raw/aborted")
    s3_client.abort_multipart_upload(Bucket=s3_bucket, Key="raw/aborted", UploadId=upload)
    listed = _answer(
        lambda: s3_client.list_parts(Bucket=s3_bucket, Key="raw/aborted", UploadId=upload)
    )
    again = _answer(
        lambda: s3_client.abort_multipart_upload(
            Bucket=s3_bucket, Key="raw/aborted", UploadId=upload
        )
    )
    _record(record_property, s3_target, "list_parts / abort after an abort", f"{listed} / {again}")

    with open_store(f"{scheme}://{s3_bucket}/w", part_size="5MiB", streams=2) as store:
        w = store.open_writer("a.bin")
        w.write(b"q" * (2 * PART + 1))
        w.abort()
        assert not store.exists("a.bin")
        assert store.list_incomplete() == []
        assert store.cleanup_incomplete() == 0
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


def test_a_write_whose_upload_was_aborted_fails_and_leaves_nothing(
    s3_target: S3Target, s3_bucket: str, raw: Any, record_property: Any
) -> None:
    s3_client = raw
    upload, parts = _mpu(s3_client, s3_bucket, "raw/gone")
    s3_client.abort_multipart_upload(Bucket=s3_bucket, Key="raw/gone", UploadId=upload)
    part = _answer(
        lambda: s3_client.upload_part(
            Bucket=s3_bucket, Key="raw/gone", UploadId=upload, PartNumber=2, Body=b"x"
        )
    )
    done = _answer(
        lambda: s3_client.complete_multipart_upload(
            Bucket=s3_bucket, Key="raw/gone", UploadId=upload, MultipartUpload={"Parts": parts}
        )
    )
    _record(
        record_property,
        s3_target,
        "UploadPart / CompleteMultipartUpload after an abort",
        f"{part} / {done}",
    )

    with open_store(f"s3+boto3://{s3_bucket}/w", part_size="5MiB", streams=2) as store:
        store.retry_policy = FAST_RETRIES
        w = store.open_writer("b.bin")
        w.write(b"q" * PART)
        for f in w._futures:  # the first part is in: the upload is open
            f.result()
        assert store.cleanup_incomplete() == 1  # a janitor aborts it under the writer
        w.write(b"r" * (PART + 1))
        with pytest.raises(errors.CkptioError) as info:
            w.close()
        assert "b.bin" in str(info.value)
        assert not store.exists("b.bin")
        assert store.list_incomplete() == []
