"""Admission of the registered data and models a job names (docs/datasets.md).

Contract:
- ``DataAdmission.admit(job, authorization)`` returns the job with every reference resolved
  to a version: each of ``datasets`` as ``team/name:version`` (a reference without a version
  takes the latest one now) and ``parent_model`` as ``team/name:version`` (an alias takes
  the version it points at now), with that version's id, which the job's spec carries
  (``JobSpec.parent_model_version_id``: the registry records that very version as the
  job's parent, whatever its name names by then). A job naming neither is returned as is,
  without a call.
- It asks the registry (``registry_url``) over HTTP **with the submitting user's own
  token** (``authorization``, the request's header as received): the registry applies that
  user's rights (a dataset or a model of the team or granted to it: dataset grants and model
  grants), the one place those rights are decided, so a revoked grant refuses the next job
  at once.
- A reference the registry answers 404 for is refused with ``RequestInvalid`` (422) naming
  the item (``datasets[1]``, ``parent_model``), with one message whether it does not exist
  or the team may not read it: existence does not leak. Every bad item is named at once.
- The registry answering 429 (the user's rate limit at the registry spent, its own or
  the one its token check spends) is the user's 429, with the registry's reason and
  ``Retry-After`` (``shared.identity.rate_limited``): the user's to wait for, not an
  outage, so nothing is logged for the operator.
- The registry unreachable, or answering anything but 200, 404 or 429, raises
  ``RegistryUnavailable`` (503): the job is not admitted unchecked; the operator's log says
  so, naming ``TRAINYARD_SUBMISSION_REGISTRY_URL``, once per reason a minute. Without ``registry_url``
  a job naming data is refused with 422 (nothing can check it).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

from trainyard_platform.services.submission.schemas import JobRequest
from trainyard_platform.shared.http_errors import FieldError, RequestInvalid
from trainyard_platform.shared.identity import rate_limited
from trainyard_platform.shared.logs import Throttle, held_back

log = logging.getLogger(__name__)

_REFERENCE = re.compile(r"([^/]+)/([^/:@]+)(?::([0-9]+)|@(.+))?")
UNREADABLE = "no such {kind} your team may read (it does not exist, or its team has not granted it)"


class RegistryUnavailable(Exception):
    """The registry could not say whether the job may read what it names (answered 503);
    ``detail``: the error behind it, for the operator's log."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.detail = detail


@dataclass(frozen=True)
class DataAdmission:
    registry_url: str | None
    transport: httpx.AsyncBaseTransport | None = None
    """How to reach the registry (tests: the registry's app in-process); default: HTTP."""
    timeout_s: float = 5.0
    unavailable: Throttle = field(default_factory=Throttle, compare=False)
    """How often a registry that cannot answer is logged (once per reason a minute)."""

    @staticmethod
    def asks_registry(job: JobRequest) -> bool:
        """True when ``admit`` must ask the registry (the job names datasets or a parent
        model); otherwise it returns the job as it is, at once."""
        return bool(job.datasets) or job.parent_model is not None

    async def admit(self, job: JobRequest, authorization: str) -> JobRequest:
        if not self.asks_registry(job):
            return job
        if self.registry_url is None:
            field = "datasets" if job.datasets else "parent_model"
            raise RequestInvalid.one(
                field, "cannot be checked: this platform has no registry configured"
            )
        try:
            return await self._admit(job, authorization, self.registry_url)
        except RegistryUnavailable as exc:
            repeats = self.unavailable.due(str(exc))
            if repeats is not None:
                log.warning(
                    "jobs naming datasets or a parent model cannot be checked "
                    "(TRAINYARD_SUBMISSION_REGISTRY_URL: %s): %s%s; they answer 503%s",
                    self.registry_url,
                    exc,
                    f": {' '.join(exc.detail.split())}" if exc.detail else "",
                    held_back(repeats),
                )
            raise

    async def _admit(self, job: JobRequest, authorization: str, registry_url: str) -> JobRequest:
        errors: list[FieldError] = []
        async with httpx.AsyncClient(
            base_url=registry_url,
            transport=self.transport,
            timeout=self.timeout_s,
            headers={"Authorization": authorization},
        ) as client:
            datasets = []
            for i, text in enumerate(job.datasets):
                resolved = await _dataset(client, text)
                if resolved is None:
                    errors.append(
                        FieldError(
                            field=f"datasets[{i}]", message=UNREADABLE.format(kind="dataset")
                        )
                    )
                datasets.append(resolved or text)
            parent = None if job.parent_model is None else await _model(client, job.parent_model)
            if job.parent_model is not None and parent is None:
                errors.append(
                    FieldError(
                        field="parent_model", message=UNREADABLE.format(kind="model version")
                    )
                )
            pin = job.parent_model_version_id
            if pin is not None and (parent is None or parent[1] != pin):
                errors.append(FieldError(field="parent_model_version_id", message=_unpinned(job)))
        if errors:
            raise RequestInvalid(errors)
        admitted = job.model_copy(update={"datasets": datasets})
        return admitted if parent is None else admitted.with_parent_version(*parent)


def _unpinned(job: JobRequest) -> str:
    """Why a job's pin of its parent version (``parent_model_version_id``) is refused."""
    return (
        f"is not the id of the version {job.parent_model} names now (the model was deleted "
        "and made again, or its alias moved, since the spec was written), so that version "
        "cannot be fine-tuned from, nor a job made from it reproduced; to fine-tune from the "
        "version it names now, submit the spec without this field"
    )


def _parts(text: str) -> tuple[str, str, str | None, str | None]:
    # The request's patterns (DATASET_REF_PATTERN, MODEL_REF_PATTERN) passed already: the
    # names hold no '/', '%', '.'-start or control character, so they are safe path parts.
    found = _REFERENCE.fullmatch(text)
    assert found is not None, text
    team, name, version, alias = found.groups()
    return team, name, version, alias


async def _get(client: httpx.AsyncClient, path: str) -> dict[str, Any] | None:
    try:
        answer = await client.get(path)
    except httpx.HTTPError as exc:
        raise RegistryUnavailable(
            f"the registry is unreachable ({type(exc).__name__})", str(exc)
        ) from None
    if answer.status_code == 404:
        return None
    if answer.status_code == 429:
        raise rate_limited(answer)
    if answer.status_code != 200:
        raise RegistryUnavailable(f"the registry answered {answer.status_code}")
    body: dict[str, Any] = answer.json()
    return body


async def _dataset(client: httpx.AsyncClient, text: str) -> str | None:
    team, name, version, _ = _parts(text)
    if version is not None:
        found = await _get(client, f"/v1/datasets/{team}/{name}/versions/{version}")
        return None if found is None else text
    latest = await _get(client, f"/v1/datasets/{team}/{name}")
    return None if latest is None else f"{team}/{name}:{latest['latest_version']}"


async def _model(client: httpx.AsyncClient, text: str) -> tuple[str, str | None] | None:
    """``team/name:version`` of the version ``text`` names now, and its id (None from a
    registry that does not answer it: the registry then looks the reference up by name)."""
    team, name, version, alias = _parts(text)
    if alias is not None:
        found = await _get(client, f"/v1/models/{team}/{name}/versions/by-alias/{alias}")
    else:
        found = await _get(client, f"/v1/models/{team}/{name}/versions/{version}")
    if found is None:
        return None
    version_id = found.get("id")
    return f"{team}/{name}:{found['version']}", version_id if isinstance(version_id, str) else None
