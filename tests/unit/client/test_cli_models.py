"""Pure parts of the model, data and cost commands: references, ``--by``, the lineage
tree, the cost tables, and the verified download (against an in-process HTTP transport)."""

from __future__ import annotations

import argparse
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli_models
from trainyard.cli import main
from trainyard.cli_base import CliError, Exit
from trainyard.cli_data import node_label, render_tree
from trainyard.cli_models import Ref, alias_arg, fetch_verified, parse_ref, version_arg
from trainyard.cli_tracking import cost_report_text, dimensions_arg, job_cost_text
from trainyard.client import TrainyardClient


def test_references_parse_into_team_name_version_or_alias() -> None:
    assert parse_ref("vision/cnn", "M") == Ref("vision", "cnn")
    assert parse_ref("vision/cnn:3", "M", version=None) == Ref("vision", "cnn", 3)
    assert parse_ref("vision/cnn@prod", "M", version=None, alias=True) == Ref(
        "vision", "cnn", alias="prod"
    )
    assert str(Ref("a", "b", 2)) == "a/b:2" and str(Ref("a", "b", alias="x")) == "a/b@x"
    assert Ref("a", "b.c").path == "a/b.c"


@pytest.mark.parametrize(
    ("value", "kwargs", "reason"),
    [
        ("cnn", {}, "is not TEAM/NAME"),
        ("a/b/c", {}, "is not TEAM/NAME"),
        ("../b", {}, "is not TEAM/NAME"),
        ("a/b:x", {"version": None}, "is not TEAM/NAME"),
        ("a/b:0", {"version": None}, "version must be 1 or more"),
        ("a/b:1", {}, "names a version"),
        ("a/b@prod", {"version": None}, "names an alias"),
        ("a/b", {"version": True}, "names no version"),
        ("a/b@Prod", {"version": None, "alias": True}, "is not TEAM/NAME"),
    ],
)
def test_malformed_references_name_the_argument(
    value: str, kwargs: dict[str, Any], reason: str
) -> None:
    with pytest.raises(CliError) as raised:
        parse_ref(value, "TEAM/NAME", **kwargs)
    assert raised.value.code == Exit.USAGE
    assert str(raised.value).startswith("TEAM/NAME: ") and reason in str(raised.value)


def test_aliases_versions_and_dimensions_are_checked_by_argparse() -> None:
    assert alias_arg("prod-2") == "prod-2" and version_arg("7") == 7
    for bad in ("Prod", "2x", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            alias_arg(bad)
    for bad in ("0", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            version_arg(bad)
    assert dimensions_arg("team, project") == ["team", "project"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown dimension 'colour'"):
        dimensions_arg("team,colour")
    with pytest.raises(argparse.ArgumentTypeError, match="twice"):
        dimensions_arg("team,team")


def test_bad_input_exits_2_before_any_call(capsys: pytest.CaptureFixture[str]) -> None:
    # No server listens here: exit 2, not 5, shows nothing was called.
    base = ["--url", "http://127.0.0.1:9", "--token", "t"]
    assert main([*base, "model", "show", "nope"]) == Exit.USAGE
    assert "TEAM/NAME: 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as raised:
        main([*base, "model", "rm", "a/b", "zero"])
    assert raised.value.code == Exit.USAGE
    assert "argument VERSION" in capsys.readouterr().err


GRAPH = {
    "root": "model_version:v/cnn:2",
    "direction": "upstream",
    "nodes": [
        {
            "id": "model_version:v/cnn:2",
            "kind": "model_version",
            "team": "v",
            "name": "cnn",
            "version": 2,
        },
        {"id": "checkpoint:s3://b/c.pt", "kind": "checkpoint", "uri": "s3://b/c.pt"},
        {
            "id": "job:j1",
            "kind": "job",
            "job_id": "0123456789",
            "name": "train",
            "status": "succeeded",
        },
        {
            "id": "dataset_version:v/d:3",
            "kind": "dataset_version",
            "team": "v",
            "name": "d",
            "version": 3,
        },
        {
            "id": "model_version:v/cnn:1",
            "kind": "model_version",
            "team": "v",
            "name": "cnn",
            "version": 1,
            "deleted": True,
        },
    ],
    "edges": [
        {
            "from": "checkpoint:s3://b/c.pt",
            "to": "model_version:v/cnn:2",
            "relation": "registered_as",
        },
        {"from": "job:j1", "to": "checkpoint:s3://b/c.pt", "relation": "saved"},
        {"from": "dataset_version:v/d:3", "to": "job:j1", "relation": "read_by"},
        {"from": "model_version:v/cnn:1", "to": "job:j1", "relation": "fine_tuned_by"},
        {"from": "dataset_version:v/d:3", "to": "model_version:v/cnn:2", "relation": "read_by"},
    ],
    "hidden": 2,
    "truncated": False,
}


def test_lineage_prints_as_a_tree_with_repeats_marked() -> None:
    assert render_tree(GRAPH).splitlines() == [
        "model v/cnn:2",
        "  <-read_by- dataset v/d:3",
        "  <-registered_as- checkpoint s3://b/c.pt",
        "    <-saved- job 01234567 train (succeeded)",
        "      <-fine_tuned_by- model v/cnn:1 (deleted)",
        "      <-read_by- dataset v/d:3 (see above)",
        "(2 nodes of other teams hidden)",
    ]
    down = {**GRAPH, "direction": "downstream", "root": "dataset_version:v/d:3", "hidden": 0}
    lines = render_tree(down).splitlines()
    assert lines[0] == "dataset v/d:3" and lines[1].startswith("  -read_by-> job 01234567")


def test_a_lineage_as_deep_as_the_registry_answers_prints_whole() -> None:
    # The registry answers up to 10,000 nodes; a chain of them (a model fine-tuned from one
    # fine-tuned from ...) printed by a nested call per node ended "unexpected
    # RecursionError" at some hundreds of hops.
    depth = 10_000
    nodes = [
        {"id": f"model_version:v/cnn:{k}", "kind": "model_version", "team": "v", "name": "cnn"}
        | {"version": k}
        for k in range(depth)
    ]
    edges = [
        {"from": f"model_version:v/cnn:{k - 1}", "to": f"model_version:v/cnn:{k}"}
        | {"relation": "fine_tuned_by"}
        for k in range(1, depth)
    ]
    root = f"model_version:v/cnn:{depth - 1}"
    graph = {"root": root, "direction": "upstream", "nodes": nodes, "edges": edges}
    lines = render_tree(graph).splitlines()
    assert len(lines) == depth
    assert lines[0] == f"model v/cnn:{depth - 1}"
    assert lines[1] == f"  <-fine_tuned_by- model v/cnn:{depth - 2}"
    assert lines[-1] == "  " * 32 + f"({depth - 1}) <-fine_tuned_by- model v/cnn:0"
    assert lines[32].startswith("  " * 32 + "<-") and lines[33].startswith("  " * 32 + "(33) <-")
    # A cycle (which the registry's graph should never hold) ends at the repeat.
    looped = {**graph, "edges": [*edges, {"from": root, "to": nodes[0]["id"], "relation": "x"}]}
    assert render_tree(looped).splitlines()[-1].endswith(f"model v/cnn:{depth - 1} (see above)")


def test_cost_reports_render_buckets_dimensions_and_totals() -> None:
    report = {
        "start": "2026-12-01T00:00:00Z",
        "end": "2027-01-01T00:00:00Z",
        "granularity": "day",
        "group_by": ["team", "job"],
        "rows": [
            {
                "bucket": "2026-12-01T00:00:00Z",
                "team": "ml",
                "job": "abcdef0123",
                "currency": "USD",
                "gpu_seconds": "7200.000000",
                "cost": "2.500000",
            },
        ],
        "totals": [{"currency": "USD", "gpu_seconds": "7200.000000", "cost": "2.500000"}],
        "truncated": True,
    }
    lines = cost_report_text(report).splitlines()
    assert lines[0].split() == ["BUCKET", "TEAM", "JOB", "GPU-HOURS", "COST"]
    assert lines[1].split()[-5:] == ["ml", "abcdef01", "2.00", "2.500000", "USD"]
    assert lines[-2].endswith("2.500000 USD (2.00 GPU-hours)") and "truncated" not in lines[-1]
    assert "more rows than the limit" in lines[-1]
    empty = cost_report_text({**report, "rows": [], "totals": [], "truncated": False})
    assert empty.startswith("nothing billed from")


def test_cost_reports_show_cpu_and_memory_apart_when_billed() -> None:
    row = {
        "team": "ml",
        "currency": "USD",
        "gpu_seconds": "7200",
        "cost": "3.1",
        "gpu_cost": "2.5",
        "cpu_seconds": "43200",
        "cpu_cost": "0.4",
        "unpriced_cpu_seconds": "0",
        "memory_gib_seconds": "36000",
        "memory_cost": "0.2",
        "unpriced_memory_gib_seconds": "3600",
    }
    report = {"start": "2026-12-01T00:00:00Z", "end": "2027-01-01T00:00:00Z", "group_by": ["team"]}
    report |= {"rows": [row], "totals": [{k: v for k, v in row.items() if k != "team"}]}
    lines = cost_report_text(report).splitlines()
    assert lines[0].split() == ["TEAM", "GPU-HOURS", "GPU-COST", "CPU-COST", "MEM-COST", "COST"]
    assert lines[1].split() == ["ml", "2.00", "2.500000", "0.400000", "0.200000", "3.100000", "USD"]
    assert lines[-1].endswith(
        "3.100000 USD (2.00 GPU-hours; GPU 2.500000, CPU 0.400000 for 12.00 CPU-hours, "
        "memory 0.200000 for 10.00 GiB-hours; memory partly unpriced, charged 0)"
    )


def test_a_job_bill_shows_cpus_and_memory_when_declared() -> None:
    allocation = {
        "attempt": 1,
        "node_id": "n1",
        "gpus": 2,
        "gpu_flavor": "a100",
        "cpus": 12,
        "memory_gib": 80,
        "started_at": "2026-12-01T00:00:00+00:00",
        "ended_at": "2026-12-01T01:00:00+00:00",
        "outcome": "succeeded",
        "gpu_seconds": "7200",
        "price_per_gpu_hour": "2.5",
        "cpu_cost": "0.36",
        "memory_cost": "0.4",
        "cost": "5.76",
        "currency": "USD",
    }
    bill = {"job_id": "j-1", "team": "ml", "project": None, "user": "ann"}
    bill |= {"allocations": [allocation], "totals": [{"currency": "USD", "cost": "5.76"}]}
    lines = job_cost_text(bill).splitlines()
    assert lines[1].split()[-2:] == ["CPU-AND-MEMORY", "COST"]
    assert "12 CPU 0.360000, 80 GiB 0.400000  5.760000 USD" in lines[2]


def test_a_job_bill_shows_each_allocation() -> None:
    bill = {
        "job_id": "j-1",
        "team": "ml",
        "project": None,
        "user": "ann",
        "allocations": [
            {
                "attempt": 0,  # the first attempt's index: shown as attempt 1
                "node_id": "n1",
                "gpus": 2,
                "gpu_flavor": "a100",
                "started_at": "2026-12-01T00:00:00+00:00",
                "ended_at": "2026-12-01T01:00:00+00:00",
                "outcome": "succeeded",
                "gpu_seconds": "7200",
                "price_per_gpu_hour": "2.5",
                "cost": "5",
                "currency": "USD",
            },
        ],
        "totals": [{"currency": "USD", "gpu_seconds": "7200", "cost": "5"}],
    }
    lines = job_cost_text(bill).splitlines()
    assert lines[0] == "job j-1 (ml/-, ann)"
    assert lines[2].split() == [
        "1",
        "n1",
        "2x",
        "a100",
        "1h00m",
        "succeeded",
        "2.00",
        "2.5/h",
        "5.000000",
        "USD",
    ]
    assert lines[-1] == "total: 5.000000 USD"


def _registry(body: bytes, seen: list[httpx.Request]) -> TrainyardClient:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=body)

    return TrainyardClient("http://registry", "secret", transport=httpx.MockTransport(answer))


def test_a_download_keeps_only_verified_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = b"weights" * 1000
    seen: list[httpx.Request] = []
    registry = _registry(body, seen)
    # ``download`` opens its own client (a presigned URL must not carry the token); route it
    # to the same in-process transport.
    real = httpx.Client

    def client(**kwargs: Any) -> httpx.Client:
        return real(
            transport=httpx.MockTransport(
                lambda r: (seen.append(r), httpx.Response(200, content=body))[1]
            ),
            **kwargs,
        )

    monkeypatch.setattr("trainyard.client.httpx.Client", client)
    where = {
        "url": "/v1/models/a/b/versions/1/content",
        "needs_token": True,
        "sha256": hashlib.sha256(body).hexdigest(),
        "size_bytes": len(body),
    }
    out = tmp_path / "m.pt"
    assert fetch_verified(registry, where, out) == len(body)
    assert out.read_bytes() == body
    assert seen[-1].headers["Authorization"] == "Bearer secret"
    assert str(seen[-1].url) == "http://registry/v1/models/a/b/versions/1/content"

    presigned = {
        **where,
        "url": "http://s3.example/bucket/key?X-Amz-Signature=s",
        "needs_token": False,
    }
    assert fetch_verified(registry, presigned, out) == len(body)
    assert "Authorization" not in seen[-1].headers

    out.write_bytes(b"old")
    wrong = {**where, "sha256": "0" * 64}
    with pytest.raises(CliError, match="does not match the registered version"):
        fetch_verified(registry, wrong, out)
    assert out.read_bytes() == b"old"  # the earlier file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]  # no partial file left
    with pytest.raises(CliError, match="is a folder"):
        fetch_verified(registry, where, tmp_path)
    assert cli_models.Ref("a", "b") == parse_ref("a/b", "M")


def test_a_download_larger_than_registered_stops_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A download longer than the registered size was read to its end (onto the user's
    disk) before the check refused it; it now stops at the first chunk past that size."""
    chunks_asked = 0

    def endless(client: Any, url: str, needs_token: bool, sink: Any) -> None:
        nonlocal chunks_asked
        while chunks_asked < 1000:
            chunks_asked += 1
            sink(b"w" * 1024)

    monkeypatch.setattr(cli_models, "download", endless)
    where = {"url": "/x", "needs_token": True, "sha256": "0" * 64, "size_bytes": 2048}
    with pytest.raises(CliError, match=r"more than 2048 bytes came, the registered size"):
        fetch_verified(_registry(b"", []), where, tmp_path / "m.pt")
    assert chunks_asked == 3
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fails", ["create", "write", "rename"])
def test_a_download_that_cannot_be_written_is_named_and_leaves_nothing(
    fails: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder the user may not write (``-o /proc/version`` ended "unexpected
    FileNotFoundError: ... '/proc/.version.os53whlo.part'"), a full disk, a rename refused:
    a ``CliError`` naming ``-o`` and the reason, no partial file, an existing file kept."""
    body = b"weights"
    where = {
        "url": "/c",
        "needs_token": True,
        "sha256": hashlib.sha256(body).hexdigest(),
        "size_bytes": len(body),
    }
    out = tmp_path / "m.pt"
    out.write_bytes(b"old")
    if fails == "create":

        def refuse(**_: Any) -> tuple[int, str]:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(cli_models.tempfile, "mkstemp", refuse)
    elif fails == "write":

        def full(client: Any, url: str, needs_token: bool, sink: Any) -> None:
            sink(body[:3])
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(cli_models, "download", full)
    else:
        monkeypatch.setattr(cli_models, "download", lambda c, u, n, sink: sink(body))

        def refuse_rename(source: str, target: Path) -> None:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(cli_models.os, "replace", refuse_rename)
    reason = "No space left on device" if fails == "write" else "Permission denied"
    with pytest.raises(CliError, match=f"^-o: cannot write {out}: {reason}$") as caught:
        fetch_verified(_registry(body, []), where, out)
    assert caught.value.code == Exit.ERROR
    assert out.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]


def test_a_version_past_the_registrys_largest_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The registry numbers versions as PostgreSQL integers: 2147483648 reached it and came
    # back as its parser's words (`422 ... Expected `int` <= 2147483647`, exit 1), and as
    # pydantic's other words for `alias set`.
    assert parse_ref("a/b:2147483647", "M", version=None) == Ref("a", "b", 2147483647)
    assert version_arg("2147483647") == 2147483647
    for value in ("a/b:2147483648", "a/b:99999999999999999999"):
        with pytest.raises(CliError) as raised:
            parse_ref(value, "TEAM/NAME:V", version=True)
        assert raised.value.code == Exit.USAGE
        assert str(raised.value).startswith("TEAM/NAME:V: version must be at most 2147483647")
    with pytest.raises(argparse.ArgumentTypeError, match="at most 2147483647"):
        version_arg("2147483648")
    base = ["--url", "http://127.0.0.1:9", "--token", "t"]  # nothing listens: 2, not 5
    assert main([*base, "lineage", "up", "a/b:2147483648"]) == Exit.USAGE
    assert "version must be at most 2147483647" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main([*base, "model", "alias", "set", "a/b", "prod", "2147483648"])
    assert exited.value.code == Exit.USAGE
    assert "at most 2147483647" in capsys.readouterr().err


def test_a_download_never_replaces_a_link_a_device_or_a_pipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verified bytes were renamed onto ``-o`` whatever it was: ``-o /dev/stdout`` (a
    link, for a pipe) or ``-o /dev/null`` as root replaced the device's name with a regular
    file for every program of the machine, and ``-o latest.pt`` (a link to the current
    weights) became a file of its own, the link's target untouched."""
    body = b"weights"
    where = {
        "url": "/c",
        "needs_token": True,
        "sha256": hashlib.sha256(body).hexdigest(),
        "size_bytes": len(body),
    }
    monkeypatch.setattr(cli_models, "download", lambda c, u, n, sink: sink(body))
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    (tmp_path / "to-pipe").symlink_to(pipe)
    for special in (pipe, tmp_path / "to-pipe"):
        with pytest.raises(CliError, match="is not a regular file") as caught:
            fetch_verified(_registry(body, []), where, special)
        assert caught.value.code == Exit.USAGE
    assert stat.S_ISFIFO(pipe.stat().st_mode) and (tmp_path / "to-pipe").is_symlink()
    # A link to a file: the file gets the bytes, the link stays a link.
    (tmp_path / "weights").mkdir()
    current = tmp_path / "weights" / "v3.pt"
    current.write_bytes(b"old")
    link = tmp_path / "latest.pt"
    link.symlink_to(Path("weights") / "v3.pt")
    assert fetch_verified(_registry(body, []), where, link) == len(body)
    assert link.is_symlink() and current.read_bytes() == body
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt", "pipe", "to-pipe", "weights"]
    assert [p.name for p in (tmp_path / "weights").iterdir()] == ["v3.pt"]


def test_an_empty_cost_report_names_its_filters_and_how_to_check_them() -> None:
    # A team lead's misspelt project finds nothing: the answer says what it was filtered
    # by, so the typo shows, and how to list the names that were billed.
    report = {
        "start": "2026-12-01T00:00:00Z",
        "end": "2027-01-01T00:00:00Z",
        "group_by": ["user"],
        "filters": {"team": "ml", "project": "visoin"},
        "rows": [],
        "totals": [],
        "truncated": False,
    }
    assert cost_report_text(report) == (
        "nothing billed from 2026-12-01 00:00:00Z to 2027-01-01 00:00:00Z to team ml, "
        "project visoin: check the names (trainyard cost --by team,project lists those "
        "billed)"
    )
    unfiltered = cost_report_text({**report, "filters": {}})
    assert unfiltered == "nothing billed from 2026-12-01 00:00:00Z to 2027-01-01 00:00:00Z"


def test_a_cost_table_s_rows_add_up_to_its_total_and_prices_show_as_set() -> None:
    """Money is shown to billing's six places, never rounded for the table: three rows of
    0.333333 read 0.999999 in all, as the total says (at four places they read 0.3333 each
    beside a total of 1.0000); a price is shown as it was set, not cut to four places."""
    rows = [
        {"user": user, "currency": "USD", "gpu_seconds": "3600", "cost": "0.333333"}
        for user in ("ann", "bob", "cy")
    ]
    report = {"start": "2026-12-01T00:00:00Z", "end": "2027-01-01T00:00:00Z", "group_by": ["user"]}
    report |= {
        "rows": rows,
        "totals": [{"currency": "USD", "gpu_seconds": "10800", "cost": "0.999999"}],
    }
    lines = cost_report_text(report).splitlines()
    assert [line.split()[-2] for line in lines[1:4]] == ["0.333333"] * 3
    assert lines[-1].endswith("0.999999 USD (3.00 GPU-hours)")
    allocation = {
        "attempt": 1,
        "node_id": "n1",
        "gpus": 1,
        "gpu_flavor": "t4",
        "started_at": "2026-12-01T00:00:00+00:00",
        "ended_at": "2026-12-01T01:00:00+00:00",
        "outcome": "succeeded",
        "gpu_seconds": "3600",
        "price_per_gpu_hour": "0.123456",
        "cost": "0.123456",
        "currency": "USD",
    }
    bill = {"job_id": "j-1", "team": "ml", "project": None, "user": "ann"}
    bill |= {"allocations": [allocation], "totals": [{"currency": "USD", "cost": "0.123456"}]}
    text = job_cost_text(bill)
    assert "0.123456/h" in text and text.endswith("total: 0.123456 USD")


def test_a_deleted_model_s_version_is_told_apart_from_the_model_made_again() -> None:
    """A deleted model's name may be taken by a model made again, with a version 1 of its
    own: the registry's graph holds both as different nodes, and the tree says which one is
    of the deleted model. Before, both printed as ``model v/cnn:1 (deleted)`` once the new
    model's version 1 was deleted too."""
    old = {
        "id": "model_version:v/cnn:1#0b7e",
        "kind": "model_version",
        "team": "v",
        "name": "cnn",
        "version": 1,
        "deleted": True,
        "model_deleted": True,
    }
    new = {**old, "id": "model_version:v/cnn:1", "model_deleted": False}
    assert node_label(old) == "model v/cnn:1 (deleted with its model)"
    assert node_label(new) == "model v/cnn:1 (deleted)"
    assert node_label({**new, "deleted": False}) == "model v/cnn:1"
