"""What must be checked before the OpenTelemetry SDK is imported.

Contract:
- The SDK reads ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`` when ``opentelemetry.sdk.trace`` is
  imported, and a value that is not a whole number from 0 makes that import raise its
  ``ValueError``, with a traceback, before a service can check any setting.
  ``refuse_before_import(service)``, which each service's ``__main__`` calls before its
  other imports, checks that variable as ``shared.telemetry.OtelExportSettings`` checks the
  others: when it is bad, one line ``python -m trainyard_platform.services.<service>:
  invalid setting OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT: <reason> (got '<value>')`` on standard
  error (under ``TRAINYARD_LOG_FORMAT=json`` one JSON log line of the service's format
  instead, as ``runtime.service_settings_or_exit`` writes) and exit status 2.
- ``whole_number(value, minimum)`` is the rule for the SDK's numbers: empty, or a whole
  number of at least ``minimum``.
- This module imports neither the SDK nor anything that does.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Final

READ_AT_IMPORT: Final = "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT"
"""The one variable the SDK reads when it is imported."""


def whole_number(value: str, minimum: int) -> str:
    """``value`` stripped, when it is empty or a whole number of at least ``minimum`` (as
    the SDK parses it: ``int`` of the stripped text); else a ``ValueError`` saying so."""
    text = value.strip()
    if not text:
        return text
    try:
        number = int(text)
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise ValueError(f"must be a whole number from {minimum}, or empty")
    return text


def refuse_before_import(service: str) -> None:
    """Exit with status 2, naming it, when ``READ_AT_IMPORT`` is bad (see the module)."""
    value = os.environ.get(READ_AT_IMPORT)
    if value is None:
        return
    try:
        whole_number(value, minimum=0)
    except ValueError as exc:
        line = f"invalid setting {READ_AT_IMPORT}: {exc} (got {value!r})"
    else:
        return
    if os.environ.get("TRAINYARD_LOG_FORMAT", "").strip().lower() == "json":
        from trainyard_platform.shared.logs import formatter  # no SDK import (module)

        log = logging.getLogger("trainyard_platform.shared.runtime")
        record = log.makeRecord(
            log.name, logging.CRITICAL, __file__, 0, f"cannot start: {line}", (), None
        )
        print(formatter(service, "json").format(record), file=sys.stderr)
    else:
        print(f"python -m trainyard_platform.services.{service}: {line}", file=sys.stderr)
    raise SystemExit(2)
