"""The lineage graph (docs/lineage.md): dataset versions -> jobs -> checkpoints -> model
versions -> jobs that fine-tune from them -> new model versions.

Contract:
- ``upstream(conn, version)``: everything a model version came from, transitively: the job
  that made it and the checkpoint it was registered from, the checkpoints that job's restarts
  really resumed from (``job.started``'s ``resumed_from``), the dataset versions it was given
  (the access audit) and the jobs that produced them, and its parent model version (the one
  it fine-tuned from) with that version's own upstream.
- ``downstream(conn, dataset_version)``: everything made from a dataset version,
  transitively: the jobs given it, the model versions registered from their checkpoints, the
  jobs that fine-tuned from those and what they made, and dataset versions produced by any of
  these jobs with their own downstream.
- A graph holds at most ``MAX_NODES`` nodes; past it, ``truncated`` says so.
- ``Graph.visible_to`` keeps what a caller may see (its team's nodes, and the dataset and
  model versions of other teams that granted it reading them; operators all) and counts the
  rest as ``hidden``, dropping their edges: a grant opens the dataset or model, never the
  jobs and checkpoints of the team that made it (a granted version node's ``job_id`` is
  null: ``grantee_view.shown_detail``).
- ``openlineage`` turns a graph into OpenLineage run events (one ``RunEvent`` per job:
  ``eventType``, ``eventTime``, ``run``, ``job``, ``inputs``, ``outputs``, ``producer``,
  ``schemaURL``), as the OpenLineage 2-0-2 spec names them.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, Literal

import asyncpg

from trainyard_platform.services.registry import dataset_repository as datasets
from trainyard_platform.services.registry import grantee_view
from trainyard_platform.services.registry import lineage_repository as lineage_repo
from trainyard_platform.services.registry.dataset_repository import DatasetVersion
from trainyard_platform.services.registry.domain import ModelVersion
from trainyard_platform.services.registry.lineage_repository import JobFacts

MAX_NODES: Final = 10_000
Kind = Literal["dataset_version", "job", "checkpoint", "model_version"]
PRODUCER: Final = "https://trainyard.dev/registry"
SCHEMA_URL: Final = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"
NAMESPACE: Final = "trainyard"
_EVENT_TYPES: Final = {
    "running": "RUNNING",
    "succeeded": "COMPLETE",
    "failed": "FAIL",
    "cancelled": "ABORT",
}


@dataclass
class Node:
    id: str
    kind: Kind
    team: str
    detail: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "team": self.team, **self.detail}


@dataclass
class Graph:
    root: str
    direction: Literal["upstream", "downstream"]
    nodes: dict[str, Node] = field(default_factory=dict)
    edges: list[tuple[str, str, str]] = field(default_factory=list)
    jobs: dict[str, JobFacts] = field(default_factory=dict)
    truncated: bool = False
    hidden: int = 0
    _linked: set[tuple[str, str, str]] = field(default_factory=set, repr=False, compare=False)
    """``edges`` as a set: a link is checked in constant time, not by a scan of every edge
    (a dataset read by 10,000 jobs made a walk scan 50 million edges)."""

    def add(self, node: Node) -> bool:
        """Add ``node``; False if it was there already (or the graph is full)."""
        if node.id in self.nodes:
            return False
        if len(self.nodes) >= MAX_NODES:
            self.truncated = True
            return False
        self.nodes[node.id] = node
        return True

    def link(self, source: str, target: str, relation: str) -> None:
        edge = (source, target, relation)
        if edge not in self._linked:
            self._linked.add(edge)
            self.edges.append(edge)

    def prune(self) -> None:
        """Drop the edges to or from a node the graph had no room for (``truncated``): every
        edge joins two of its nodes, which the OpenLineage export and readers rely on."""
        if self.truncated:
            self.edges = [e for e in self.edges if e[0] in self.nodes and e[1] in self.nodes]
            self._linked = set(self.edges)

    async def visible_to(
        self, team: str | None, may_read: Callable[[Kind, str, str], Awaitable[bool]]
    ) -> Graph:
        """The part ``team`` (None: an operator) may see; ``may_read(kind, team, name)``
        answers for another team's dataset or model (its grants), asked once per name."""
        if team is None:
            return self
        answers: dict[tuple[Kind, str, str], bool] = {}

        async def granted(node: Node) -> bool:
            if node.kind not in ("dataset_version", "model_version"):
                return False
            if node.detail.get("model_deleted"):
                return False  # its grants went with it; a model made again has its own
            key = (node.kind, node.team, str(node.detail["name"]))
            if key not in answers:
                answers[key] = await may_read(*key)
            return answers[key]

        kept: dict[str, Node] = {}
        for node in self.nodes.values():
            if node.team == team:
                kept[node.id] = node
            elif await granted(node):  # the version, not the owner's job that made it
                detail = grantee_view.shown_detail(node.detail, node.team, team)
                kept[node.id] = Node(node.id, node.kind, node.team, detail)
        shown = Graph(self.root, self.direction, kept)
        shown.edges = [e for e in self.edges if e[0] in kept and e[1] in kept]
        shown._linked = set(shown.edges)
        shown.jobs = {key: f for key, f in self.jobs.items() if key in kept}
        shown.truncated = self.truncated
        shown.hidden = len(self.nodes) - len(kept)
        return shown

    def as_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "direction": self.direction,
            "nodes": [n.as_json() for n in self.nodes.values()],
            "edges": [{"from": s, "to": t, "relation": r} for s, t, r in self.edges],
            "hidden": self.hidden,
            "truncated": self.truncated,
        }


def _job_id(job_id: str) -> str:
    return f"job:{job_id}"


def _model_id(version: ModelVersion) -> str:
    """A version's node id: ``model_version:TEAM/NAME:V``; for a version of a deleted model,
    whose name a model made again may hold with a version V of its own, ``#`` and the
    version's id follow."""
    made = f"model_version:{version.team}/{version.model_name}:{version.version}"
    return f"{made}#{version.id}" if version.model_deleted else made


def _dataset_id(version: DatasetVersion) -> str:
    return f"dataset_version:{version.reference}"


def _checkpoint_id(uri: str) -> str:
    return f"checkpoint:{uri}"


def model_node(version: ModelVersion) -> Node:
    return Node(
        _model_id(version),
        "model_version",
        version.team,
        {
            "name": version.model_name,
            "version": version.version,
            "job_id": version.job_id,
            "sha256": version.artifact.sha256,
            "deleted": version.deleted_at is not None,
            "model_deleted": version.model_deleted,
        },
    )


def dataset_node(version: DatasetVersion) -> Node:
    return Node(
        _dataset_id(version),
        "dataset_version",
        version.team,
        {
            "name": version.name,
            "version": version.version,
            "uri": version.uri,
            "sha256": version.sha256,
            "feature_version": version.feature_version,
        },
    )


def job_node(facts: JobFacts) -> Node:
    return Node(
        _job_id(facts.job_id),
        "job",
        facts.team,
        {"job_id": facts.job_id, "name": facts.name, "status": facts.status},
    )


def _source_checkpoint(version: ModelVersion) -> str:
    """The committed checkpoint the version was registered from."""
    return version.source_uri or version.artifact.uri


Step = Callable[[], Awaitable[list["Step"]]]
"""One hop of a walk: it adds what it finds and answers the hops to take from there."""


class _Walk:
    """A walk over the graph's reads, one hop at a time from a stack: a chain of any length
    (a model fine-tuned from one fine-tuned from ..., data made from data made from ...)
    takes no deeper a stack than one hop, where a call per hop ran out of stack at some
    hundreds of hops. Depth first, each hop's next hops in the order its reads give them."""

    def __init__(self, conn: asyncpg.Connection, graph: Graph) -> None:
        self.conn = conn
        self.graph = graph

    async def run(self, first: Step) -> None:
        stack = [first]
        while stack:
            stack.extend(reversed(await stack.pop()()))
        self.graph.prune()

    async def job(self, job_id: str) -> bool:
        """Add the job and its resumed checkpoints; False if it was there already."""
        facts = await lineage_repo.job_facts(self.conn, job_id)
        if not self.graph.add(job_node(facts)):
            return False
        self.graph.jobs[_job_id(job_id)] = facts
        for uri in facts.resumed_from:
            self.graph.add(Node(_checkpoint_id(uri), "checkpoint", facts.team, {"uri": uri}))
            self.graph.link(_checkpoint_id(uri), _job_id(job_id), "resumed_by")
        return True

    def registration(self, version: ModelVersion, team: str) -> None:
        """job -> checkpoint -> model version."""
        uri = _source_checkpoint(version)
        self.graph.add(model_node(version))
        self.graph.add(Node(_checkpoint_id(uri), "checkpoint", team, {"uri": uri}))
        self.graph.link(_job_id(version.job_id), _checkpoint_id(uri), "saved")
        self.graph.link(_checkpoint_id(uri), _model_id(version), "registered_as")

    async def up_from_model(self, version: ModelVersion) -> list[Step]:
        self.registration(version, version.team)
        return [partial(self.up_from_job, version.job_id)]

    async def up_from_job(self, job_id: str) -> list[Step]:
        if not await self.job(job_id):
            return []
        steps: list[Step] = []
        for given in await datasets.accessed_by(self.conn, job_id):
            self.graph.add(dataset_node(given))
            self.graph.link(_dataset_id(given), _job_id(job_id), "read_by")
            if given.producing_job_id is not None:
                self.graph.link(_job_id(given.producing_job_id), _dataset_id(given), "produced")
                steps.append(partial(self.up_from_job, given.producing_job_id))
        parent_id = await lineage_repo.parent_of_job(self.conn, job_id)
        parent = (
            None if parent_id is None else await lineage_repo.version_by_id(self.conn, parent_id)
        )
        if parent is not None:
            self.graph.link(_model_id(parent), _job_id(job_id), "fine_tuned_by")
            steps.append(partial(self.up_from_model, parent))
        return steps

    async def down_from_dataset(self, version: DatasetVersion) -> list[Step]:
        self.graph.add(dataset_node(version))
        steps: list[Step] = []
        for job_id in await datasets.readers_of(self.conn, version.id):
            self.graph.link(_dataset_id(version), _job_id(job_id), "read_by")
            steps.append(partial(self.down_from_job, job_id))
        return steps

    async def down_from_job(self, job_id: str) -> list[Step]:
        if not await self.job(job_id):
            return []
        steps: list[Step] = []
        team = self.graph.jobs[_job_id(job_id)].team
        for made in await lineage_repo.versions_of_job(self.conn, job_id):
            self.registration(made, team)
            for child in await lineage_repo.children_of_version(self.conn, made.id):
                self.graph.link(_model_id(made), _job_id(child), "fine_tuned_by")
                steps.append(partial(self.down_from_job, child))
        for produced in await datasets.produced_by(self.conn, job_id):
            self.graph.link(_job_id(job_id), _dataset_id(produced), "produced")
            steps.append(partial(self.down_from_dataset, produced))
        return steps


async def upstream(conn: asyncpg.Connection, version: ModelVersion) -> Graph:
    graph = Graph(_model_id(version), "upstream")
    walk = _Walk(conn, graph)
    await walk.run(partial(walk.up_from_model, version))
    return graph


async def downstream(conn: asyncpg.Connection, version: DatasetVersion) -> Graph:
    graph = Graph(_dataset_id(version), "downstream")
    walk = _Walk(conn, graph)
    await walk.run(partial(walk.down_from_dataset, version))
    return graph


def _run_id(job_id: str) -> str:
    """OpenLineage wants a UUID: a job id that is one (submission's are), else a UUID
    derived from it (the same every time)."""
    try:
        return str(uuid.UUID(job_id))
    except ValueError:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"trainyard:job:{job_id}"))


def _dataset_of(node: Node) -> dict[str, Any]:
    """An OpenLineage dataset for a graph node (namespace and name identify it): a version
    of a deleted model is named ``TEAM/NAME#ID`` (its version id), as its node."""
    if node.kind == "checkpoint":
        return {"namespace": f"{NAMESPACE}.checkpoints", "name": node.detail["uri"], "facets": {}}
    kind = "datasets" if node.kind == "dataset_version" else "models"
    version = {
        "_producer": PRODUCER,
        "_schemaURL": "https://openlineage.io/spec/facets/1-0-1/DatasetVersionDatasetFacet.json",
        "datasetVersion": str(node.detail["version"]),
    }
    name = f"{node.team}/{node.detail['name']}"
    if node.kind == "model_version" and node.detail.get("model_deleted"):
        # As its node id (``_model_id``): a model made again under the deleted one's name
        # has versions of its own, another dataset. No name holds a ``#``.
        name += node.id[node.id.rindex("#") :]
    return {
        "namespace": f"{NAMESPACE}.{kind}",
        "name": name,
        "facets": {"version": version},
    }


def openlineage(graph: Graph) -> list[dict[str, Any]]:
    """One OpenLineage ``RunEvent`` per job of ``graph``: its inputs are the nodes with an
    edge into the job, its outputs those it has an edge to, and the model versions
    registered from its checkpoints."""
    into: dict[str, list[str]] = {}
    out_of: dict[str, list[tuple[str, str]]] = {}
    for source, target, relation in graph.edges:  # once, not once per job
        into.setdefault(target, []).append(source)
        out_of.setdefault(source, []).append((target, relation))
    events = []
    for job_key, facts in graph.jobs.items():
        inputs = [graph.nodes[s] for s in into.get(job_key, [])]
        outputs = [graph.nodes[t] for t, _ in out_of.get(job_key, [])]
        registered = [
            graph.nodes[t]
            for out in outputs
            for t, relation in out_of.get(out.id, [])
            if relation == "registered_as"
        ]
        when = facts.ended_at or facts.started_at
        events.append(
            {
                "eventType": _EVENT_TYPES.get(facts.status, "OTHER"),
                "eventTime": when.isoformat() if when else None,
                "producer": PRODUCER,
                "schemaURL": SCHEMA_URL,
                "run": {"runId": _run_id(facts.job_id), "facets": {}},
                "job": {
                    "namespace": f"{NAMESPACE}.{facts.team}",
                    "name": f"{facts.project}.{facts.name}",
                    "facets": {},
                },
                "inputs": [_dataset_of(n) for n in inputs],
                "outputs": [_dataset_of(n) for n in [*outputs, *registered]],
            }
        )
    return events
