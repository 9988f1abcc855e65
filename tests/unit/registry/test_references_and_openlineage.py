"""Pure parts of datasets and lineage: the references a spec makes, and the OpenLineage
run events a graph turns into."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from trainyard_platform.services.registry import lineage, references
from trainyard_platform.services.registry.lineage import Graph, Node
from trainyard_platform.services.registry.lineage_repository import JobFacts
from trainyard_platform.services.registry.references import Reference

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_references_parse_versions_and_aliases() -> None:
    assert references.parse("vision/digits", alias_allowed=False) == Reference("vision", "digits")
    assert references.parse("ml/f.v2:12", alias_allowed=False) == Reference("ml", "f.v2", 12)
    parsed = references.parse("vision/cnn@production", alias_allowed=True)
    assert parsed == Reference("vision", "cnn", None, "production")
    assert str(parsed) == "vision/cnn@production"


@pytest.mark.parametrize(
    "text",
    [
        "vision/..",
        "../x",
        "vision/.d",
        "/vision/d",
        "vision/d/e",
        "vision/d:0",
        "v/d\x00",
        "v/d@Up",
    ],
)
def test_references_refuse_anything_that_is_not_two_names(text: str) -> None:
    with pytest.raises(ValueError):
        references.parse(text, alias_allowed=True)


def test_a_dataset_reference_may_not_name_an_alias() -> None:
    with pytest.raises(ValueError, match="alias"):
        references.parse("vision/digits@latest", alias_allowed=False)


def _graph(job_id: str, status: str) -> Graph:
    graph = Graph("model_version:vision/cnn:1", "upstream")
    data = Node(
        "dataset_version:vision/d:3", "dataset_version", "vision", {"name": "d", "version": 3}
    )
    job = Node(f"job:{job_id}", "job", "vision", {"job_id": job_id})
    ckpt = Node("checkpoint:s3://b/c.pt", "checkpoint", "vision", {"uri": "s3://b/c.pt"})
    model = Node(
        "model_version:vision/cnn:1", "model_version", "vision", {"name": "cnn", "version": 1}
    )
    for node in (data, job, ckpt, model):
        graph.add(node)
    graph.link(data.id, job.id, "read_by")
    graph.link(job.id, ckpt.id, "saved")
    graph.link(ckpt.id, model.id, "registered_as")
    graph.jobs[job.id] = JobFacts(job_id, "vision", "cnn", "exp", status, T0, None, [])
    return graph


def test_a_job_becomes_a_run_event_with_its_inputs_and_outputs() -> None:
    job_id = str(uuid.uuid4())
    (event,) = lineage.openlineage(_graph(job_id, "running"))
    assert event["eventType"] == "RUNNING" and event["eventTime"] == T0.isoformat()
    assert event["run"]["runId"] == job_id
    assert event["job"] == {"namespace": "trainyard.vision", "name": "exp.cnn", "facets": {}}
    assert [(i["namespace"], i["name"]) for i in event["inputs"]] == [
        ("trainyard.datasets", "vision/d")
    ]
    assert event["inputs"][0]["facets"]["version"]["datasetVersion"] == "3"
    assert [(o["namespace"], o["name"]) for o in event["outputs"]] == [
        ("trainyard.checkpoints", "s3://b/c.pt"),
        ("trainyard.models", "vision/cnn"),
    ]


def test_a_job_id_that_is_no_uuid_gets_a_stable_one() -> None:
    first = lineage.openlineage(_graph("job-1", "succeeded"))[0]
    again = lineage.openlineage(_graph("job-1", "succeeded"))[0]
    assert first["run"]["runId"] == again["run"]["runId"] != "job-1"
    assert uuid.UUID(first["run"]["runId"]).version == 5
    assert first["eventType"] == "COMPLETE"


async def test_what_a_team_may_not_see_is_counted_not_shown() -> None:
    graph = _graph("job-1", "succeeded")
    graph.add(Node("job:job-2", "job", "ml", {"job_id": "job-2"}))
    graph.link("model_version:vision/cnn:1", "job:job-2", "fine_tuned_by")

    async def nothing_granted(kind: str, team: str, name: str) -> bool:
        return False

    shown = await graph.visible_to("vision", nothing_granted)
    assert "job:job-2" not in shown.nodes and shown.hidden == 1
    assert all("job:job-2" not in edge for edge in shown.edges)
    theirs = await graph.visible_to("ml", nothing_granted)
    assert set(theirs.nodes) == {"job:job-2"} and theirs.jobs == {}


class _Id(str):
    """A node id that counts how often it is compared for equality."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        _Id.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_a_wide_graph_costs_work_in_proportion_to_its_edges() -> None:
    """A dataset read by N jobs: linking its edges compared each with every edge before
    (N^2/2 comparisons: 20,000 edges took 17 s on the registry's event loop), and the
    OpenLineage export scanned every edge for each job. Now both are linear."""
    n = 2_000
    graph = Graph("dataset_version:vision/d:1", "downstream")
    data = Node(
        _Id("dataset_version:vision/d:1"), "dataset_version", "vision", {"name": "d", "version": 1}
    )
    graph.add(data)
    _Id.compared = 0
    for i in range(n):
        job = Node(_Id(f"job:j{i}"), "job", "vision", {"job_id": f"j{i}"})
        graph.add(job)
        graph.jobs[job.id] = JobFacts(f"j{i}", "vision", "cnn", "exp", "succeeded", T0, None, [])
        graph.link(data.id, job.id, "read_by")
        graph.link(data.id, job.id, "read_by")  # a second time: still one edge
    assert len(graph.edges) == n
    events = lineage.openlineage(graph)
    assert len(events) == n and all(len(e["inputs"]) == 1 for e in events)
    assert _Id.compared < 10 * n, _Id.compared


def test_a_deleted_model_s_version_is_a_dataset_of_its_own_in_openlineage() -> None:
    """A deleted model's name may be taken by a model made again, with a version 1 of its
    own: in the lineage graph the two are different nodes (the deleted one's id ends in
    ``#`` and its version id), and so they are different OpenLineage datasets. Before, both
    were ``trainyard.models`` ``vision/cnn`` version 1: one dataset version for two."""
    old_id = str(uuid.uuid4())
    graph = _graph("job-1", "succeeded")
    old = Node(
        f"model_version:vision/cnn:1#{old_id}",
        "model_version",
        "vision",
        {"name": "cnn", "version": 1, "deleted": True, "model_deleted": True},
    )
    graph.add(old)
    ckpt = "checkpoint:s3://b/c.pt"
    graph.link(ckpt, old.id, "registered_as")
    (event,) = lineage.openlineage(graph)
    models = [o for o in event["outputs"] if o["namespace"] == "trainyard.models"]
    assert [(o["name"], o["facets"]["version"]["datasetVersion"]) for o in models] == [
        ("vision/cnn", "1"),
        (f"vision/cnn#{old_id}", "1"),
    ]
