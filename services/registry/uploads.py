"""Incomplete multipart uploads on S3: the parts of an upload that never completed (a runner
that died mid-upload) are stored and billed, yet no listing of objects shows them.

``S3Uploads`` lists the incomplete uploads under the collector's key prefixes and aborts
one. The object-store interface has no such listing, so it speaks to S3 directly through
minio's ListMultipartUploads and AbortMultipartUpload calls — minio 7 exposes them only as
underscore methods, pinned by the tests against the S3 endpoint. Which uploads are stale is
the collector's rule (marks, like objects'), not S3's ``Initiated`` time: moto reports a
fixed date there. Blocking: call through ``asyncio.to_thread``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from minio import Minio

MAX_PAGES = 100
"""Pages (1,000 uploads each) read per prefix and pass; the rest wait for the next pass."""


@dataclass(frozen=True)
class Upload:
    key: str
    """The object name in the bucket."""
    upload_id: str


class S3Uploads:
    """The incomplete uploads under ``prefixes`` (object names) of ``bucket``."""

    def __init__(self, client: Minio, bucket: str, prefixes: Sequence[str]) -> None:
        self._client = client
        self._bucket = bucket
        self._prefixes = list(prefixes)

    def list(self) -> list[Upload]:
        found: list[Upload] = []
        for prefix in self._prefixes:
            key_marker: str | None = None
            for _ in range(MAX_PAGES):
                page = self._client._list_multipart_uploads(
                    self._bucket, prefix=prefix, key_marker=key_marker
                )
                found.extend(
                    Upload(u.object_name, u.upload_id) for u in page.uploads if u.upload_id
                )
                # Paged by key only (minio drops the upload-id marker): uploads of one key
                # past a page's end wait for the next pass.
                if not page.is_truncated or page.next_key_marker is None:
                    break
                key_marker = page.next_key_marker
        return found

    def abort(self, upload: Upload) -> None:
        self._client._abort_multipart_upload(self._bucket, upload.key, upload.upload_id)
