"""Object storage for checkpoints, artifacts and logs, chosen by URI scheme, under the
platform's name: ``open_store``, the store contract, the local folder and S3 are defined once,
in the client distribution (``trainyard.storage``), because a job's SDK opens stores too.
The platform depends on the client with its ``s3`` extra, so S3 is always available here.
"""

from trainyard.storage import (
    LocalStore,
    ObjectNotFound,
    ObjectStore,
    ObjectTooLarge,
    key_in_store,
    open_store,
    split_uri,
    validate_key,
    validate_prefix,
)
from trainyard.storage.s3 import S3Store

__all__ = [
    "LocalStore",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectTooLarge",
    "S3Store",
    "key_in_store",
    "open_store",
    "split_uri",
    "validate_key",
    "validate_prefix",
]
