"""Object storage as a training job sees it: the store contract and a local folder.

``open_store(uri)`` returns the ``LocalStore`` rooted at a ``file`` URI:
``file:///abs/path``, or ``file://./relative/path`` (relative to the current folder at open
time). That is every store a job opens: on the platform its checkpoint folder is a local
staging folder the runner uploads from (``trainyard.control``), and outside it checkpoints
stay on the local disk. S3 is the platform's (``shared.storage`` opens ``s3://`` URIs with
the platform's credentials), so this distribution carries no S3 client; an ``s3`` URI here
is refused with ``ValueError`` saying so.

``split_uri`` splits an object's URI (as ``uri_for`` returns it, ``file`` or ``s3``) into
its folder's URI and the object's name, so ``open_store(root).get_bytes(key)`` reads it.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from trainyard.storage.base import ObjectNotFound, ObjectStore, validate_key, validate_prefix
from trainyard.storage.local import LocalStore

__all__ = [
    "LocalStore",
    "ObjectNotFound",
    "ObjectStore",
    "open_store",
    "parse_uri",
    "split_uri",
    "validate_key",
    "validate_prefix",
]


def open_store(uri: str) -> ObjectStore:
    """The store rooted at the ``file`` URI ``uri``; any other scheme raises ``ValueError``."""
    scheme, rest = parse_uri(uri)
    if scheme == "file":
        return LocalStore(_file_path(uri, rest))
    if scheme == "s3":
        raise ValueError(
            f"{uri!r}: S3 stores are opened by the platform (trainyard-platform's "
            "shared.storage), not by the client; a job's checkpoints go to the local folder "
            "the runner names (file://...)"
        )
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
