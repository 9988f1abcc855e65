"""Every JSON body is validated strictly (``parse_body``): a value of the wrong JSON type is
refused with 422 naming its field, never coerced (``{"version": "3"}`` is not version 3).
Checked on every request model the registry and billing read with it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from trainyard_platform.services.billing.budgets import BudgetRequest
from trainyard_platform.services.billing.governance_schemas import EstimateRequest, PriceRequest
from trainyard_platform.services.registry.dataset_schemas import DatasetVersionRequest
from trainyard_platform.services.registry.schemas import AliasRequest, RegisterRequest
from trainyard_platform.services.registry.tracking_schemas import NoteBody
from trainyard_platform.shared.http_errors import RequestInvalid, parse_body

DATASET = {"uri": "s3://d/x", "sha256": "a" * 64, "size_bytes": 1}
COERCIBLE: list[tuple[type[BaseModel], dict[str, Any], str]] = [
    (AliasRequest, {"version": "3"}, "version"),
    (AliasRequest, {"version": 3.0}, "version"),
    (AliasRequest, {"version": True}, "version"),
    (RegisterRequest, {"job_id": 7}, "job_id"),
    (RegisterRequest, {"job_id": "j", "metrics": {"acc": "0.9"}}, "metrics.acc"),
    (RegisterRequest, {"job_id": "j", "tags": "baseline"}, "tags"),
    (DatasetVersionRequest, {**DATASET, "size_bytes": "10"}, "size_bytes"),
    (DatasetVersionRequest, {**DATASET, "feature_version": 3}, "feature_version"),
    (NoteBody, {"note": 5}, "note"),
    (BudgetRequest, {"amount": "10", "thresholds": ["50"]}, "thresholds[0]"),
    (BudgetRequest, {"amount": "10", "thresholds": [50.0]}, "thresholds[0]"),
    (PriceRequest, {"price_per_gpu_hour": True}, "price_per_gpu_hour"),
    (EstimateRequest, {"gpus": "2", "gpu_flavor": "a100"}, "gpus"),
    (
        EstimateRequest,
        {"gpus": 2, "gpu_flavor": "a100", "max_runtime_seconds": "60"},
        "max_runtime_seconds",
    ),
]


@pytest.mark.parametrize(("model", "body", "field"), COERCIBLE)
def test_a_value_of_the_wrong_type_is_refused_naming_its_field(
    model: type[BaseModel], body: dict[str, Any], field: str
) -> None:
    with pytest.raises(RequestInvalid) as refused:
        parse_body(model, json.dumps(body).encode())
    assert field in [e.field for e in refused.value.errors], refused.value.errors


def test_what_json_can_only_say_as_a_string_still_reads() -> None:
    """Money as a decimal string, times as ISO 8601 and enums by name: JSON has no other
    way to say them, so strictness takes them."""
    budget = parse_body(BudgetRequest, b'{"amount": "10.5", "policy": "refuse"}')
    # Kept with six places (829b842), as billing answers it.
    assert str(budget.amount) == "10.500000" and budget.policy == "refuse"
    price = parse_body(
        PriceRequest, b'{"price_per_gpu_hour": 2.75, "effective_from": "2030-01-01T00:00:00Z"}'
    )
    assert price.effective_from is not None and price.effective_from.year == 2030
    assert parse_body(AliasRequest, b'{"version": 3}').version == 3
    assert parse_body(RegisterRequest, b'{"job_id": "j", "metrics": {"acc": 1}}').metrics == {
        "acc": 1.0
    }
