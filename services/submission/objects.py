"""What the submission service keeps in, and reads from, the object store.

- Code bundles, content-addressed per team: ``bundles/<team>/<sha256>.tar.gz``. A team sees
  only its own bundles: a sha256 another team uploaded is "not uploaded" for this one.
- Job logs, written by the runner under ``logs/<job_id>/`` (see ``logs``); read here only.

The object store is synchronous; every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from trainyard_platform.services.submission import logs
from trainyard_platform.shared.storage import ObjectNotFound, ObjectStore


def bundle_key(team: str, sha256: str) -> str:
    return f"bundles/{team}/{sha256}.tar.gz"


class Objects:
    """The service's view of the object store."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    async def bundle_size(self, team: str, sha256: str) -> int | None:
        """The size in bytes of the team's bundle ``sha256``, None when the team has not
        uploaded it: one look at the object (an S3 HEAD), which says both."""
        return await asyncio.to_thread(self.store.size, bundle_key(team, sha256))

    async def put_bundle(self, team: str, sha256: str, path: Path) -> bool:
        """Store a verified bundle (the file ``path``); False when it was there already
        (then nothing is written: the key is its content's hash)."""
        key = bundle_key(team, sha256)
        if await asyncio.to_thread(self.store.exists, key):
            return False
        await asyncio.to_thread(self.store.put_file, key, path)
        return True

    async def log_keys(self, job_id: str) -> list[str]:
        """The job's log objects, relative to its log prefix, sorted."""
        prefix = logs.prefix(job_id)
        keys = await asyncio.to_thread(self.store.list, prefix)
        return [key[len(prefix) :] for key in keys if key.startswith(prefix)]

    async def read_log(self, job_id: str, key: str) -> bytes | None:
        """One log object (``key`` relative to the job's prefix); None if it is gone."""
        try:
            return await asyncio.to_thread(self.store.get_bytes, logs.prefix(job_id) + key)
        except ObjectNotFound:
            return None
