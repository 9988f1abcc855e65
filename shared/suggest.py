"""Did you mean ...? under the platform's name: defined once in ``trainyard.suggest``, so the
client and the services suggest the same words."""

from trainyard.suggest import NOT_JOB_FIELDS, closest, unknown_field

__all__ = ["NOT_JOB_FIELDS", "closest", "unknown_field"]
