"""What a code bundle may hold, under the platform's name: defined once in
``trainyard.bundle_archive``, so that the CLI refuses to upload what the submission service
and the runner would refuse, by the same rule."""

from trainyard.bundle_archive import (
    MAX_BUNDLE_DEPTH,
    MAX_BUNDLE_MEMBERS,
    MAX_UNPACKED_BYTES,
    NAME_MAX,
    PATH_MAX,
    BundleRefused,
    check_bundle,
    check_name,
    shown,
)

__all__ = [
    "MAX_BUNDLE_DEPTH",
    "MAX_BUNDLE_MEMBERS",
    "MAX_UNPACKED_BYTES",
    "NAME_MAX",
    "PATH_MAX",
    "BundleRefused",
    "check_bundle",
    "check_name",
    "shown",
]
