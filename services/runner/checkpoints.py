"""Which checkpoint a job will resume from, read from the object store without torch.

The layout is the SDK's (``trainyard.sdk.checkpoints``): ``step-<8+ digits>/checkpoint.pt``
and ``step-.../manifest.json``, the manifest written last. A step is *complete* when its
manifest names an object that exists. The runner does not download or hash the object
(that is the job's work at restore time, and it may skip a corrupt one for an older one),
so ``resumed_from`` is the checkpoint the job is expected to resume from.

Blocking store calls: call through ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import logging
import re

from shared.storage import ObjectNotFound, ObjectStore, validate_key

log = logging.getLogger(__name__)

_MANIFEST_KEY = re.compile(r"^step-(\d{8,})/manifest\.json$")


def latest_complete_checkpoint(store: ObjectStore) -> str | None:
    """The URI of the newest complete checkpoint object in ``store``, or None."""
    steps = sorted(
        (int(m.group(1)), key) for key in store.list("step-") if (m := _MANIFEST_KEY.match(key))
    )
    for step, manifest_key in reversed(steps):
        try:
            manifest = json.loads(store.get_bytes(manifest_key))
            object_key = validate_key(str(manifest["object"]))
        except (ObjectNotFound, ValueError, KeyError, TypeError) as exc:
            log.warning("checkpoint at step %d in %s is unusable: %s", step, store.root_uri, exc)
            continue
        if store.exists(object_key):
            return store.uri_for(object_key)
        log.warning("checkpoint at step %d in %s has no object", step, store.root_uri)
    return None
