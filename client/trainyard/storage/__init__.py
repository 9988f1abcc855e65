"""Object storage for checkpoints, artifacts and logs, chosen by URI scheme.

``open_store(uri)`` returns an ``ObjectStore`` rooted at ``uri``:

* ``file:///abs/path`` or ``file://./relative/path`` (relative to the current folder at
  open time) -> ``LocalStore``;
* ``s3://bucket`` or ``s3://bucket/some/prefix`` -> ``S3Store`` on the endpoint and
  credentials of ``StorageSettings`` (the bucket is created if missing). S3 needs MinIO's
  client, this distribution's optional extra ``s3`` (``pip install "trainyard[s3]"``): on
  the platform a job's checkpoint folder is a local staging folder the runner uploads from,
  so a training environment does without it; the platform always has it.

A URI may point anywhere below a bucket or folder (``s3://bucket/jobs/abc/checkpoints``);
the store is rooted there. ``split_uri`` splits an object's URI (as ``uri_for`` returns it)
into its folder's URI and the object's name, so ``open_store(root).get_bytes(key)`` reads it.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from trainyard.storage.base import (
    ObjectNotFound,
    ObjectStore,
    ObjectTooLarge,
    validate_key,
    validate_prefix,
)
from trainyard.storage.local import LocalStore
from trainyard.storage.settings import StorageSettings

__all__ = [
    "LocalStore",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectTooLarge",
    "StorageSettings",
    "key_in_store",
    "open_store",
    "parse_uri",
    "split_uri",
    "validate_key",
    "validate_prefix",
]


def open_store(uri: str, settings: StorageSettings | None = None) -> ObjectStore:
    """The store rooted at ``uri``; ``settings`` (default: read from the environment)
    supply the S3 endpoint and credentials. Unknown schemes raise ``ValueError``; an ``s3``
    URI without the ``s3`` extra installed raises ``ImportError`` naming it."""
    scheme, rest = parse_uri(uri)
    if scheme == "file":
        return LocalStore(_file_path(uri, rest))
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ValueError(f"S3 URI {uri!r} names no bucket (expected s3://bucket/prefix)")
        try:
            from trainyard.storage.s3 import S3Store, client_from_settings
        except ModuleNotFoundError as exc:
            raise ImportError(
                f'{uri!r} is an S3 store, which needs MinIO\'s client: pip install "trainyard[s3]"'
            ) from exc
        settings = settings if settings is not None else StorageSettings()
        return S3Store(client_from_settings(settings), bucket, prefix)
    raise ValueError(
        f"unsupported object-store scheme {scheme!r} in {uri!r} (expected 'file' or 's3')"
    )


def split_uri(uri: str) -> tuple[str, str]:
    """Split an object URI into ``(folder_uri, name)``: ``s3://b/x/y.pt`` -> ``(s3://b/x,
    y.pt)``. ``file`` names are percent-decoded, undoing ``Path.as_uri``."""
    scheme, rest = parse_uri(uri)
    if scheme not in ("file", "s3"):
        raise ValueError(f"unsupported object-store scheme {scheme!r} in {uri!r}")
    head, sep, name = rest.rpartition("/")
    if not sep or not name or (scheme == "s3" and not head):
        raise ValueError(f"URI {uri!r} names no object inside a folder or bucket")
    if scheme == "file":
        name = unquote(name)
    # "file:///x" lives in the filesystem root, whose URI keeps its "/".
    return f"{scheme}://{head or '/'}", validate_key(name)


def key_in_store(store: ObjectStore, uri: str) -> str | None:
    """The key ``uri`` names in ``store``, or None when it names no valid key there (another
    store's object, a path that leaves it, a spelling ``store.uri_for`` would not write)."""
    root = store.root_uri.rstrip("/") + "/"
    if not uri.startswith(root):
        return None
    rest = uri[len(root) :]
    key = unquote(rest) if root.startswith("file:") else rest
    try:
        validate_key(key)
    except ValueError:
        return None
    return key if store.uri_for(key) == uri else None


def parse_uri(uri: str) -> tuple[str, str]:
    """``(scheme, rest)`` of a store URI, the scheme lower-cased; ``ValueError`` if none."""
    scheme, sep, rest = uri.partition("://")
    if not sep or not scheme:
        raise ValueError(f"not an object-store URI: {uri!r} (expected scheme://...)")
    return scheme.lower(), rest


def _file_path(uri: str, rest: str) -> Path:
    if rest.startswith("/"):
        return Path(unquote(rest))
    if rest.startswith("localhost/"):
        return Path(unquote(rest[len("localhost") :]))
    if rest in (".", "..") or rest.startswith(("./", "../")):
        return Path(unquote(rest))
    raise ValueError(
        f"file URI {uri!r} must be file:///absolute/path or file://./relative/path "
        "(remote hosts are not supported)"
    )
