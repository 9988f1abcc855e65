"""The lineage walk on long chains: a model fine-tuned from a model fine-tuned from ... (a
nightly retrain), and data made from data made from ... Each hop was a nested call, so a
chain some hundreds of hops long made the upstream and downstream queries, and every version
answer (its cost walks the upstream), fail with RecursionError: an internal error.

The repository's reads are replaced by an in-memory chain; the walk is the registry's own."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from trainyard_platform.services.registry import dataset_repository as datasets
from trainyard_platform.services.registry import lineage
from trainyard_platform.services.registry import lineage_repository as lineage_repo
from trainyard_platform.services.registry.lineage_repository import JobFacts

T0 = datetime(2026, 1, 2, tzinfo=UTC)
DEPTH = 2 * sys.getrecursionlimit()  # 8,001 nodes: within the graph's 10,000


def _version(k: int) -> Any:
    return SimpleNamespace(
        id=f"v{k}",
        team="vision",
        model_name="cnn",
        version=k + 1,
        job_id=f"j{k}",
        artifact=SimpleNamespace(sha256="0" * 64, uri=f"s3://b/j{k}/c.pt"),
        source_uri=f"s3://b/j{k}/c.pt",
        deleted_at=None,
        model_deleted=False,
    )


def _dataset(k: int, producer: str | None) -> Any:
    return SimpleNamespace(
        id=f"d{k}",
        team="vision",
        name="feat",
        version=k + 1,
        uri=f"s3://b/d{k}",
        sha256="1" * 64,
        feature_version="",
        producing_job_id=producer,
        reference=f"vision/feat:{k + 1}",
    )


@pytest.fixture
def chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Job k fine-tunes from version k-1 (made by job k-1) and reads dataset k-1, which job
    k-1 produced; job 0 reads dataset ``d-root``."""

    async def job_facts(conn: Any, job_id: str) -> JobFacts:
        return JobFacts(job_id, "vision", job_id, "p", "succeeded", T0, T0, [])

    async def accessed_by(conn: Any, job_id: str) -> list[Any]:
        k = int(job_id[1:])
        return [_dataset(k - 1, f"j{k - 1}")] if k else [_dataset(-1, None)]

    async def parent_of_job(conn: Any, job_id: str) -> str | None:
        k = int(job_id[1:])
        return f"v{k - 1}" if k else None

    async def version_by_id(conn: Any, version_id: str) -> Any:
        return _version(int(version_id[1:]))

    async def readers_of(conn: Any, version_id: str) -> list[str]:
        k = int(version_id[1:]) + 1
        return [f"j{k}"] if k < DEPTH else []

    async def versions_of_job(conn: Any, job_id: str) -> list[Any]:
        return [_version(int(job_id[1:]))]

    async def children_of_version(conn: Any, version_id: str) -> list[str]:
        k = int(version_id[1:]) + 1
        return [f"j{k}"] if k < DEPTH else []

    async def produced_by(conn: Any, job_id: str) -> list[Any]:
        k = int(job_id[1:])
        return [_dataset(k, job_id)] if k < DEPTH - 1 else []

    for module, name, fake in [
        (lineage_repo, "job_facts", job_facts),
        (lineage_repo, "parent_of_job", parent_of_job),
        (lineage_repo, "version_by_id", version_by_id),
        (lineage_repo, "versions_of_job", versions_of_job),
        (lineage_repo, "children_of_version", children_of_version),
        (datasets, "accessed_by", accessed_by),
        (datasets, "readers_of", readers_of),
        (datasets, "produced_by", produced_by),
    ]:
        monkeypatch.setattr(module, name, fake)


@pytest.mark.usefixtures("chain")
async def test_a_long_upstream_chain_is_walked_whole() -> None:
    graph = await lineage.upstream(None, _version(DEPTH - 1))  # type: ignore[arg-type]
    # Per hop: its job, checkpoint, version and the dataset it read.
    assert len(graph.nodes) == 4 * DEPTH and not graph.truncated
    assert ("model_version:vision/cnn:1", "job:j1", "fine_tuned_by") in graph.edges
    assert ("job:j0", "dataset_version:vision/feat:1", "produced") in graph.edges
    assert ("dataset_version:vision/feat:0", "job:j0", "read_by") in graph.edges
    assert len(lineage.openlineage(graph)) == DEPTH


@pytest.mark.usefixtures("chain")
async def test_a_long_downstream_chain_is_walked_whole() -> None:
    graph = await lineage.downstream(None, _dataset(-1, None))  # type: ignore[arg-type]
    assert len(graph.nodes) == 4 * DEPTH and not graph.truncated
    last = DEPTH - 1
    assert (f"model_version:vision/cnn:{last}", f"job:j{last}", "fine_tuned_by") in graph.edges


@pytest.mark.usefixtures("chain")
async def test_a_graph_cut_at_its_limit_still_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    # An edge to a node the full graph had no room for made the OpenLineage export fail
    # (KeyError) for an operator, whose graph is not filtered.
    monkeypatch.setattr(lineage, "MAX_NODES", 50)
    graph = await lineage.upstream(None, _version(DEPTH - 1))  # type: ignore[arg-type]
    assert graph.truncated and len(graph.nodes) == 50
    assert all(s in graph.nodes and t in graph.nodes for s, t, _ in graph.edges)
    assert lineage.openlineage(await graph.visible_to(None, _never))
    assert graph.as_json()["truncated"] is True


async def _never(*_: Any) -> bool:
    return False
