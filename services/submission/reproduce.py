"""``POST /v1/jobs/{job_id}/reproduce``: submit the same job again, linked to the original.

Contract:
- Only a job of the caller's own team can be reproduced (any other id, operators' included,
  answers 404 like a job that does not exist: the registry compares a reproduction only
  within one team); the caller needs ``member``.
- Only a job that has ended (SUCCEEDED, FAILED or CANCELLED) can be: its reproduction is
  compared with how it ended (409 otherwise).
- The new job has the original's resolved spec as stored at its admission — the same code
  (bundle sha256 or git commit), entrypoint, arguments, requirements, image, hyper-parameters,
  seed, dataset versions and parent model version — with ``reproduces`` naming the
  original, the caller as its user, and ``register_model`` false (a reproduction checks a
  model, it does not make one). The parent's ``team/name:version`` is admitted again, pinned
  to the version id the original was admitted with (``parent_model_version_id``): 422
  naming it when that version is gone (its model deleted and made again under its name).
  It passes admission like any job: budgets (``governance``) and the data permissions
  (``data_admission``: the team must still be able to read every dataset version).
- The optional body may change ``datasets``, ``seed`` or ``hyperparameters`` (keys merged
  over the original's) on purpose, to see what a change does: the registry's verdict then
  names what differs. Unknown fields are refused (422 naming them).
- An ``Idempotency-Key`` used before by this user for the same reproduction (the same job,
  the same changes) answers 200 with the job it stored, before the budgets or the registry
  are asked and though its flavor is retired since, as ``POST /v1/jobs`` does (``commands.replay``); anything else under it, 409.
  Such a retry spends a read of the rate limits, anything else a write, as ``POST /v1/jobs``
  (``ratelimit.replays_as_read``).
- When the reproduction ends, the registry records the verdict (``GET /v1/jobs/{id}/
  reproduction`` on the registry; docs/reproducibility.md).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import asyncpg
from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, HeaderParameter
from pydantic import BaseModel, ConfigDict, Field

from trainyard_platform.services.submission import commands, governance
from trainyard_platform.services.submission import repository as repo
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.data_admission import DataAdmission
from trainyard_platform.services.submission.domain import JobStatus
from trainyard_platform.services.submission.errors import Conflict, NotFound
from trainyard_platform.services.submission.governance import BUDGET_WARNING_HEADER
from trainyard_platform.services.submission.identity import Caller
from trainyard_platform.services.submission.objects import Objects
from trainyard_platform.services.submission.ratelimit import (
    OwedWrite,
    charged_unless_replayed,
    owed_write,
    replays_as_read,
)
from trainyard_platform.services.submission.schemas import (
    JobView,
    parse_idempotency_key,
    parse_job_request,
    request_fingerprint,
)
from trainyard_platform.shared.access import needs
from trainyard_platform.shared.events.payloads import (
    MAX_DATASETS,
    MAX_REFERENCE,
    MAX_SEED,
    HyperValue,
    JobSpec,
)
from trainyard_platform.shared.http_app import error_responses, json_request_body
from trainyard_platform.shared.http_errors import (
    RequestInvalid,
    parse_body,
    read_body,
    read_json_body,
)
from trainyard_platform.shared.identity import Role

Pool = NamedDependency[asyncpg.Pool]
Me = NamedDependency[Caller]
Config = NamedDependency[Settings]
Store = NamedDependency[Objects]
Admission = NamedDependency[DataAdmission]
IdempotencyKey = Annotated[str | None, HeaderParameter(name="Idempotency-Key")]

BODY_MAX_BYTES = 64 * 1024


class ReproduceRequest(BaseModel):
    """Deliberate changes to the reproduction (none: the same job exactly)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    datasets: list[Annotated[str, Field(min_length=3, max_length=MAX_REFERENCE)]] | None = Field(
        default=None, max_length=MAX_DATASETS
    )
    """Dataset versions instead of the original's (``team/name[:version]``)."""
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    hyperparameters: dict[Annotated[str, Field(max_length=200)], HyperValue] | None = Field(
        default=None, max_length=64
    )
    """Merged over the original's, key by key."""


def reproduction_body(original: JobSpec, changes: ReproduceRequest) -> bytes:
    """The ``POST /v1/jobs`` body of the reproduction of ``original`` (module contract)."""
    spec: dict[str, Any] = {
        key: value
        for key, value in original.model_dump(mode="json").items()
        # Empty values are the request's defaults (an empty ``command`` is refused as such).
        # The parent's version id goes with it, a pin: a reproduction fine-tunes from that
        # very version or is refused (a model made again under its name is another).
        if key not in ("user", "team", "reproduces") and value not in (None, "", [])
    }
    spec["register_model"] = False
    if changes.datasets is not None:
        spec["datasets"] = list(changes.datasets)
    if changes.seed is not None:
        spec["seed"] = changes.seed
    if changes.hyperparameters:
        spec["hyperparameters"] = {**spec.get("hyperparameters", {}), **changes.hyperparameters}
    return json.dumps(spec).encode()


def _located(view: JobView) -> dict[str, str]:
    return {"Location": f"/v1/jobs/{view.id}"}


def _replayed(view: JobView, owed: OwedWrite | None) -> Response[JobView]:
    """The answer of a retry answered from its key's job: charged a read only."""
    if owed is not None:
        owed.replayed()
    return Response(view, status_code=200, headers=_located(view))


async def _changes(request: Request[Any, Any, Any]) -> ReproduceRequest:
    announced = request.headers.get("content-length", "")
    if announced == "0" or (not announced and "transfer-encoding" not in request.headers):
        await read_body(request, BODY_MAX_BYTES, "the body is too large")
        return ReproduceRequest()
    body = await read_json_body(request, BODY_MAX_BYTES, free_text=lambda _path: False)
    return parse_body(ReproduceRequest, body) if body.strip() else ReproduceRequest()


@post(
    "/jobs/{job_id:str}/reproduce",
    status_code=201,
    request_max_body_size=None,
    # A retry answered from its Idempotency-Key's job spends a read (``ratelimit``).
    opt={**needs(Role.MEMBER), **replays_as_read()},
    operation_class=json_request_body(ReproduceRequest, example={}),
    summary="Submit the same job again, linked to it; the registry judges the reproduction",
    responses={
        200: ResponseSpec(
            JobView,
            description="the reproduction this Idempotency-Key already submitted, with the "
            "same request",
            generate_examples=False,
        ),
        **error_responses(404, 409, 413, 415),
    },
)
async def reproduce_job(
    job_id: FromPath[str],
    request: Request[Any, Any, Any],
    pool: Pool,
    objects: Store,
    caller: Me,
    settings: Config,
    admission: Admission,
    key: IdempotencyKey = None,
) -> Response[JobView]:
    # A replay is charged the read the guard spent; anything else a write.
    with charged_unless_replayed(owed_write(request.scope["state"])) as owed:
        return await _reproduce(
            job_id, request, pool, objects, caller, settings, admission, key, owed
        )


async def _reproduce(
    job_id: str,
    request: Request[Any, Any, Any],
    pool: asyncpg.Pool,
    objects: Objects,
    caller: Caller,
    settings: Settings,
    admission: DataAdmission,
    key: str | None,
    owed: OwedWrite | None,
) -> Response[JobView]:
    caller.require(Role.MEMBER, "reproducing jobs")
    changes = await _changes(request)
    async with pool.acquire() as conn:
        row = await repo.job_for_team(conn, caller.team_id, job_id)
    if row is None:
        raise NotFound(f"job {job_id} not found")
    status = JobStatus(row["status"])
    if not status.is_terminal:
        reason = f"job {job_id} has not ended ({status})"
        raise Conflict(  # the detail holds the field's message: a client says it once
            f"{reason}: a reproduction is compared with how it ended; reproduce it once it has",
            field="job_id",
            message=reason,
        )
    original = JobSpec.model_validate(row["spec"])
    screening = await governance.screening(pool, settings.flavors, caller.team)
    body = reproduction_body(original, changes)
    try:
        job = parse_job_request(body, screening.flavors)
    except RequestInvalid as refused:
        replayed = await commands.replay_despite_flavor(
            pool, caller, key, body, refused, reproduces=job_id
        )
        if replayed is None:
            raise
        return _replayed(replayed, owed)
    checked_key = parse_idempotency_key(key)
    fingerprint = None
    if checked_key is not None:
        # As ``POST /v1/jobs``: a retry answers with its key's job before the budgets and
        # the registry, which may say otherwise now, are asked.
        fingerprint = request_fingerprint(job, reproduces=job_id, team=caller.team)
        replayed = await commands.replay(pool, caller, checked_key, fingerprint)
        if replayed is not None:
            return _replayed(replayed, owed)
    if owed is not None:
        owed.spend()  # a new job from here on: a write, before anything is stored
    job, warnings, lowered = screening.admit(job)
    job = await admission.admit(job, request.headers.get("authorization", ""))
    view, created = await commands.submit_job(
        pool,
        objects,
        caller,
        job,
        checked_key,
        reproduces=job_id,
        lowered=lowered,
        fingerprint=fingerprint,
    )
    if not created and owed is not None:
        owed.replayed()
    headers = _located(view)
    if warnings and created:
        headers[BUDGET_WARNING_HEADER] = "; ".join(warnings)
    return Response(view, status_code=201 if created else 200, headers=headers)
