"""``LocalStore``, under the platform's name: defined in ``trainyard.storage.local``."""

from trainyard.storage.local import LocalStore

__all__ = ["LocalStore"]
