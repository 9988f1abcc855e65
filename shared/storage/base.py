"""The object-store contract and its key rules, under the platform's name for them.

They are defined once, in the client distribution (``trainyard.storage.base``); see there.
"""

from trainyard.storage.base import (
    TEMP_PREFIX,
    ObjectNotFound,
    ObjectStore,
    ObjectTooLarge,
    bounded,
    read_file_chunks,
    validate_key,
    validate_prefix,
    write_file_atomically,
)

__all__ = [
    "TEMP_PREFIX",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectTooLarge",
    "bounded",
    "read_file_chunks",
    "validate_key",
    "validate_prefix",
    "write_file_atomically",
]
