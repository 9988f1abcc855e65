"""The HTTP job schema: every bad field is named, defaults are filled in."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import pytest

from trainyard_platform.services.submission.config import DEFAULT_FLAVORS
from trainyard_platform.services.submission.schemas import (
    CreateUserRequest,
    JobRequest,
    parse_idempotency_key,
    parse_job_request,
    request_fingerprint,
)
from trainyard_platform.shared.http_errors import RequestInvalid, field_path, parse_body

GOOD: dict[str, Any] = {
    "name": "digits-cnn",
    "entrypoint": "examples.digits_cnn",
    "gpus": 2,
    "gpu_flavor": "h200",
}


def _errors(body: dict[str, Any] | bytes) -> dict[str, str]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(RequestInvalid) as caught:
        parse_job_request(raw, DEFAULT_FLAVORS)
    return {e.field: e.message for e in caught.value.errors}


def test_minimal_spec_gets_the_documented_defaults() -> None:
    job = parse_job_request(json.dumps(GOOD).encode(), DEFAULT_FLAVORS)
    assert job.args == []
    assert job.hyperparameters == {}
    assert (job.seed, job.max_runtime_seconds, job.max_restarts) == (0, 3600, 3)
    assert job.dataset is None and job.team is None


def test_to_spec_stamps_the_caller_and_keeps_value_types() -> None:
    body = {**GOOD, "hyperparameters": {"lr": 0.1, "layers": 3, "opt": "sgd", "nesterov": True}}
    spec = parse_job_request(json.dumps(body).encode(), DEFAULT_FLAVORS).to_spec("alice", "ml")
    assert (spec.user, spec.team, spec.gpus, spec.gpu_flavor) == ("alice", "ml", 2, "h200")
    assert spec.hyperparameters == {"lr": 0.1, "layers": 3, "opt": "sgd", "nesterov": True}
    assert type(spec.hyperparameters["nesterov"]) is bool
    assert type(spec.hyperparameters["layers"]) is int


@pytest.mark.parametrize("missing", ["name", "entrypoint", "gpus", "gpu_flavor"])
def test_missing_field_is_named(missing: str) -> None:
    body = {k: v for k, v in GOOD.items() if k != missing}
    errors = _errors(body)
    assert list(errors) == [missing]
    assert errors[missing].startswith("field required")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpus", "2"),  # no silent coercion from strings
        ("gpus", 2.5),
        ("gpus", True),
        ("seed", "7"),
        ("name", 5),
        ("args", "--epochs 2"),
        ("hyperparameters", [1, 2]),
        ("max_restarts", None),
    ],
)
def test_wrong_type_is_named(field: str, value: object) -> None:
    assert list(_errors({**GOOD, field: value})) == [field]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpus", -1),
        ("gpus", 0),
        ("gpus", 65),
        ("seed", -1),
        ("max_runtime_seconds", 0),
        ("max_runtime_seconds", 604_801),
        ("max_restarts", 21),
        ("name", "has space"),
        ("name", "x" * 101),
        ("entrypoint", "/abs/train.py"),
        ("entrypoint", "examples/digits"),
        ("entrypoint", "1examples.digits"),
        ("entrypoint", "examples..digits"),
        ("dataset", ""),
    ],
)
def test_out_of_range_or_malformed_value_is_named(field: str, value: object) -> None:
    assert list(_errors({**GOOD, field: value})) == [field]


def test_negative_gpus_message_says_why() -> None:
    assert _errors({**GOOD, "gpus": -4})["gpus"] == "must be at least 1"


def test_unknown_flavor_lists_the_allowed_ones() -> None:
    message = _errors({**GOOD, "gpu_flavor": "tpu-v5"})["gpu_flavor"]
    assert "tpu-v5" in message
    assert all(flavor in message for flavor in DEFAULT_FLAVORS)


def test_configured_flavors_are_the_allowed_ones() -> None:
    body = json.dumps({**GOOD, "gpu_flavor": "mi300"}).encode()
    assert parse_job_request(body, ["mi300"]).gpu_flavor == "mi300"
    with pytest.raises(RequestInvalid):
        parse_job_request(json.dumps(GOOD).encode(), ["mi300"])


def test_unknown_field_is_named() -> None:
    assert _errors({**GOOD, "colour": "blue"}) == {"colour": "unknown field 'colour'"}


def test_an_unknown_field_whose_name_holds_a_dot_is_named_whole() -> None:
    # Was a ValueError (an internal error, 500): the dot read as a path into an object
    # whose field names nobody knows.
    assert _errors({**GOOD, "a.b": 1}) == {"a.b": "unknown field 'a.b'"}
    assert _errors({**GOOD, "resources.gpus": 1}) == {
        "resources.gpus": "unknown field 'resources.gpus'"
    }
    code = {"kind": "bundle", "sha256": "0" * 64, "size_bytes": 1, "x.y": 1}
    assert _errors({**GOOD, "code": code}) == {"code.x.y": "unknown field 'x.y'"}


def test_priority_is_a_class_name_defaulting_to_normal() -> None:
    assert parse_job_request(json.dumps(GOOD).encode(), DEFAULT_FLAVORS).priority == "normal"
    job = parse_job_request(json.dumps({**GOOD, "priority": "high"}).encode(), DEFAULT_FLAVORS)
    assert job.to_spec("alice", "ml").priority == "high"
    for bad in ("High", "9lives", "", "x" * 41, "a_b"):
        assert set(_errors({**GOOD, "priority": bad})) == {"priority"}


def test_nested_errors_carry_their_path() -> None:
    errors = _errors({**GOOD, "args": ["ok", 3], "hyperparameters": {"lr": {"x": 1}}})
    assert set(errors) == {"args[1]", "hyperparameters.lr"}
    assert errors["hyperparameters.lr"] == "must be a number, a string or a boolean"


def test_every_error_is_reported_at_once() -> None:
    errors = _errors({"gpus": -1, "gpu_flavor": "tpu", "extra": 1})
    assert set(errors) == {"name", "entrypoint", "gpus", "gpu_flavor", "extra"}


def test_non_finite_hyperparameter_is_refused() -> None:
    raw = b'{"name": "n", "entrypoint": "m", "gpus": 1, "gpu_flavor": "cpu", "hyperparameters": {"lr": NaN}}'
    assert list(_errors(raw)) == ["hyperparameters.lr"]


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1]", b'"spec"', b"null"])
def test_body_that_is_not_an_object_is_reported_as_body(raw: bytes) -> None:
    assert list(_errors(raw)) == ["body"]


def test_field_path_formats() -> None:
    assert field_path(()) == "body"
    assert field_path(("gpus",)) == "gpus"
    assert field_path(("args", 2)) == "args[2]"
    assert field_path(("hyperparameters", "lr")) == "hyperparameters.lr"


def test_create_user_request_defaults_to_member_and_refuses_unknown_roles() -> None:
    assert parse_body(CreateUserRequest, b'{"name": "carol"}').role == "member"
    with pytest.raises(RequestInvalid) as caught:
        parse_body(CreateUserRequest, b'{"name": "carol", "role": "root"}')
    assert [e.field for e in caught.value.errors] == ["role"]


def test_job_request_is_not_a_wire_event() -> None:
    assert "user" not in JobRequest.model_fields


def test_idempotency_key_header() -> None:
    assert parse_idempotency_key(None) is None
    assert parse_idempotency_key("nightly run 2024-06-01") == "nightly run 2024-06-01"
    for bad in ("", "k" * 201, "caf\u00e9", "tab\there"):
        with pytest.raises(RequestInvalid) as caught:
            parse_idempotency_key(bad)
        assert [e.field for e in caught.value.errors] == ["Idempotency-Key"]


def _fingerprint(raw: bytes) -> str:
    return request_fingerprint(parse_job_request(raw, DEFAULT_FLAVORS), team="ml").stored


def test_a_request_fingerprint_is_of_the_json_not_its_spelling() -> None:
    """A retry's body is compared with the first by this fingerprint (``Idempotency-Key``):
    the same JSON however its keys are ordered, spaced or escaped is the same request."""
    body = {**GOOD, "hyperparameters": {"lr": 0.1, "name": "caf\u00e9"}, "labels": {"a": "b"}}
    compact = json.dumps(body, separators=(",", ":")).encode()
    reordered = json.dumps(dict(reversed(list(body.items()))), indent=4, sort_keys=True)
    unescaped = json.dumps(body, ensure_ascii=False).encode()
    fingerprints = {_fingerprint(raw) for raw in (compact, reordered.encode(), unescaped)}
    assert len(fingerprints) == 1
    (fingerprint,) = fingerprints
    assert len(fingerprint) == 64 and set(fingerprint) <= set("0123456789abcdef")


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 8},
        {"priority": "low"},
        {"gpus": 1},
        {"hyperparameters": {"lr": 0.2, "name": "caf\u00e9"}},
        {"labels": {"a": "c"}},
        {"priority": "high"},
        {"seed": 1},
        {"team": "vision"},  # another team than the caller's
        {"hyperparameters": {"lr": 0.1, "name": "caf\u00e9", "extra": 1}},
        {"args": ["--fast"]},
        {"experiment": "e1"},
        {"max_runtime_seconds": 3601},
        {"register_model": True},
    ],
)
def test_a_changed_field_changes_the_request_fingerprint(change: dict[str, Any]) -> None:
    body = {**GOOD, "hyperparameters": {"lr": 0.1, "name": "caf\u00e9"}, "labels": {"a": "b"}}
    first = _fingerprint(json.dumps(body).encode())
    assert _fingerprint(json.dumps({**body, **change}).encode()) != first


def test_a_reproductions_fingerprint_names_the_job_it_reproduces() -> None:
    job = parse_job_request(json.dumps(GOOD).encode(), DEFAULT_FLAVORS)
    one = request_fingerprint(job, reproduces="j1", team="ml")
    assert one == request_fingerprint(job, reproduces="j1", team="ml")
    assert len({request_fingerprint(job, r, team="ml").stored for r in (None, "j1", "j2")}) == 3


EVERY_DEFAULT: dict[str, Any] = {
    "apiVersion": "trainyard.dev/v1",
    "kind": "Job",
    "team": "ml",  # the caller's
    "command": None,
    "code": None,
    "requirements": [],
    "image": None,
    "args": [],
    "cpus_per_gpu": 0,
    "memory_gib_per_gpu": 0,
    "hyperparameters": {},
    "seed": 0,
    "max_runtime_seconds": 3600,
    "dataset": None,
    "max_restarts": 3,
    "priority": "normal",
    "project": "default",
    "experiment": None,
    "labels": {},
    "register_model": False,
    "datasets": [],
    "parent_model": None,
}


@pytest.mark.parametrize("spelled", [*({k: v} for k, v in EVERY_DEFAULT.items()), EVERY_DEFAULT])
def test_a_default_left_out_or_spelled_out_is_the_same_request(spelled: dict[str, Any]) -> None:
    """A client library that fills in defaults on a retry sends the same request: the
    fingerprint is of the request with its defaults applied (and ``team`` as the caller's,
    ``apiVersion``/``kind`` aside). Before, a field sent with its default value changed the
    fingerprint, and the retry was refused 409."""
    assert _fingerprint(json.dumps({**GOOD, **spelled}).encode()) == _fingerprint(
        json.dumps(GOOD).encode()
    )


def test_the_same_values_of_another_type_are_another_request() -> None:
    """What the job gets differs: ``1`` and ``1.0`` are not the same hyper-parameter."""
    ints = _fingerprint(json.dumps({**GOOD, "hyperparameters": {"lr": 1}}).encode())
    floats = _fingerprint(json.dumps({**GOOD, "hyperparameters": {"lr": 1.0}}).encode())
    listed = _fingerprint(json.dumps({**GOOD, "requirements": ["a", "b"]}).encode())
    reordered = _fingerprint(json.dumps({**GOOD, "requirements": ["b", "a"]}).encode())
    assert ints != floats and listed != reordered


def test_a_fingerprint_stored_in_the_earlier_form_still_matches_its_retry() -> None:
    """Jobs stored before defaults were part of the fingerprint kept the sha256 of the
    fields their body set; a retry of the same body still matches it, another body does
    not, and neither form ever matches a fingerprint of the other form of another body."""
    body = {**GOOD, "seed": 0}
    fields = parse_job_request(json.dumps(body).encode(), DEFAULT_FLAVORS).model_dump(
        mode="json", by_alias=True, exclude_unset=True
    )
    earlier = hashlib.sha256(
        json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    retry = request_fingerprint(parse_job_request(json.dumps(body).encode(), None), team="ml")
    assert retry.matches(earlier) and retry.stored != earlier
    other = request_fingerprint(
        parse_job_request(json.dumps({**body, "seed": 1}).encode(), None), team="ml"
    )
    assert not other.matches(earlier) and not other.matches(retry.stored)
    # A body spelling every field out is, in the earlier form, the very text of the
    # canonical one but for the form's own key: the two forms never meet.
    spelled = {k: v for k, v in EVERY_DEFAULT.items() if k not in ("apiVersion", "kind")}
    full = request_fingerprint(
        parse_job_request(json.dumps({**GOOD, **spelled}).encode(), None), team="ml"
    )
    assert full.as_sent != full.stored and not retry.matches(full.as_sent)


# --- entrypoint or command, code, requirements, image ----------------------------------------

SHA = "3fa2c1d" + "0" * 57
COMMIT = "a" * 40


def _job(**change: object) -> JobRequest:
    return parse_job_request(json.dumps({**GOOD, **change}).encode(), DEFAULT_FLAVORS)


@pytest.mark.parametrize("entrypoint", ["train.py", "scripts/train.py", "a/b_c/d-e.v2.py", "m"])
def test_entrypoint_is_a_module_or_a_relative_script(entrypoint: str) -> None:
    code = {"kind": "git", "repository": "https://github.com/o/r", "commit": COMMIT}
    job = _job(entrypoint=entrypoint, code=code)
    assert job.to_spec("alice", "ml").entrypoint == entrypoint


def test_a_script_entrypoint_needs_code() -> None:
    """``trainyard submit job.yaml --no-code`` with ``entrypoint: train.py`` was accepted,
    and every attempt failed with "can't open file .../code/train.py": a script is run from
    the job's code, so a job with none can never start it. A module may come from the
    requirements or the image, so it still needs none."""
    assert _errors({**GOOD, "entrypoint": "train.py"}) == {
        "entrypoint": "a .py script runs from the job's code and this job has none: give "
        "code (trainyard submit packs the spec's folder unless --no-code) or a module"
    }
    assert _job(entrypoint="m").code is None


@pytest.mark.parametrize(
    ("entrypoint", "says"),
    [
        ("/etc/train.py", "relative to the code root"),
        ("../train.py", "'..'"),
        ("a/../../train.py", "'..'"),
        ("a//train.py", "empty segments"),
        ("./train.py", "'.'"),
        ("-m.py", "dotted Python module"),
        ("a/.hidden.py", "dotted Python module"),
        ("a b.py", "dotted Python module"),
        ("", "at least 1 character"),
    ],
)
def test_entrypoint_paths_that_could_escape_are_refused(entrypoint: str, says: str) -> None:
    assert says in _errors({**GOOD, "entrypoint": entrypoint})["entrypoint"]


def test_command_instead_of_entrypoint() -> None:
    body = {k: v for k, v in GOOD.items() if k != "entrypoint"}
    spec = _job(**{**body, "entrypoint": None, "command": ["bash", "run.sh", ""]})
    wire = spec.to_spec("alice", "ml")
    assert (wire.entrypoint, wire.command) == ("", ["bash", "run.sh", ""])
    assert _job().to_spec("alice", "ml").command == []


def test_exactly_one_of_entrypoint_and_command() -> None:
    both = _errors({**GOOD, "command": ["python", "x.py"]})
    assert both == {"command": "give either entrypoint or command, not both"}
    neither = {k: v for k, v in GOOD.items() if k != "entrypoint"}
    assert "or command" in _errors(neither)["entrypoint"]
    # named together with the other errors, not only once they are fixed
    assert set(_errors({**neither, "gpus": 0})) == {"entrypoint", "gpus"}


@pytest.mark.parametrize(
    ("command", "field"),
    [
        ([], "command"),
        (["x"] * 201, "command"),
        ([""], "command"),
        (["python", "a\x00b"], "command[1]"),
        (["python", "x" * 10_001], "command[1]"),
        (["python", 3], "command[1]"),
        ("python train.py", "command"),
    ],
)
def test_bad_command_is_named(command: object, field: str) -> None:
    body = {k: v for k, v in GOOD.items() if k != "entrypoint"}
    assert list(_errors({**body, "command": command})) == [field]


def test_code_bundle_and_git_reach_the_wire_spec() -> None:
    bundle = _job(code={"kind": "bundle", "sha256": SHA, "size_bytes": 1234}).to_spec("a", "ml")
    assert bundle.code is not None and bundle.code.kind == "bundle"
    assert bundle.code.sha256 == SHA and bundle.code.size_bytes == 1234
    repo = "https://github.com/acme/train.git"
    git = _job(code={"kind": "git", "repository": repo, "commit": COMMIT}).to_spec("a", "ml")
    assert git.code is not None and git.code.kind == "git" and git.code.repository == repo
    assert _job().to_spec("a", "ml").code is None


@pytest.mark.parametrize(
    "repository",
    [
        "https://github.com/acme/train.git",
        "https://github.com:443/acme/train.git",
        "git://example.org/train",
    ],
)
def test_git_repository_urls_accepted(repository: str) -> None:
    assert _job(code={"kind": "git", "repository": repository, "commit": COMMIT}).code


@pytest.mark.parametrize(
    "repository",
    [
        "ssh://git@github.com:22/acme/train.git",
        "ssh://github.com/acme/train.git",
        "git+ssh://git@github.com/acme/train.git",
        "ssh+git://git@github.com/acme/train.git",
        "git@github.com:acme/train.git",
        # What ssh would read as an option is refused as ssh all the same.
        "ssh://-oProxyCommand@example.com/x.git",
        "-oProxyCommand@example.com:x.git",
        "git@example.com:-x.git",
    ],
)
def test_a_repository_by_ssh_is_refused_saying_what_to_do_instead(repository: str) -> None:
    """A job fetches its code as its own uid, without keys (never the host's: one team
    could name another's private repository), so an ssh fetch could never succeed: taken
    here, the job failed on the node as the platform's, retried, again and again."""
    errors = _errors({**GOOD, "code": {"kind": "git", "repository": repository, "commit": COMMIT}})
    assert errors == {
        "code.repository": (
            "ssh is not supported: a job fetches its code without keys, so only a "
            "public repository by https:// or git:// can be fetched; for a private repository "
            "submit a code bundle (leave code out of the spec and `trainyard submit` packs and "
            "uploads its folder)"
        )
    }


@pytest.mark.parametrize(
    ("code", "field"),
    [
        ({"kind": "bundle", "sha256": "ABC", "size_bytes": 1}, "code.sha256"),
        ({"kind": "bundle", "sha256": SHA.upper(), "size_bytes": 1}, "code.sha256"),
        ({"kind": "bundle", "sha256": SHA, "size_bytes": -1}, "code.size_bytes"),
        ({"kind": "bundle", "sha256": SHA}, "code.size_bytes"),
        ({"kind": "bundle", "sha256": SHA, "size_bytes": 1, "x": 1}, "code.x"),
        ({"kind": "git", "repository": "https://h/r", "commit": "abc"}, "code.commit"),
        ({"kind": "git", "repository": "http://h/r", "commit": COMMIT}, "code.repository"),
        ({"kind": "git", "repository": "file:///etc", "commit": COMMIT}, "code.repository"),
        ({"kind": "git", "repository": "--upload-pack=x", "commit": COMMIT}, "code.repository"),
        ({"kind": "git", "repository": "ext::sh -c x", "commit": COMMIT}, "code.repository"),
        ({"kind": "git", "repository": "https://h/a b", "commit": COMMIT}, "code.repository"),
        ({"kind": "git", "repository": "https://u:tok@h/r", "commit": COMMIT}, "code.repository"),
        (
            {"kind": "git", "repository": "https://h/" + "x" * 500, "commit": COMMIT},
            "code.repository",
        ),
        ({"kind": "svn", "repository": "https://h/r"}, "code.kind"),
        ({"sha256": SHA}, "code.kind"),
        ("bundle", "code"),
    ],
)
def test_bad_code_is_named(code: object, field: str) -> None:
    assert list(_errors({**GOOD, "code": code})) == [field]


@pytest.mark.parametrize(
    "repository",
    [
        "https://ghp_0123456789abcdef@github.com/acme/train.git",
        "https://oauth2@gitlab.example.com/acme/train.git",
        "git://someone@example.org/train",
    ],
)
def test_a_git_url_with_a_token_before_its_host_is_refused(repository: str) -> None:
    """A spec is readable by the whole team and travels in every service's events, so a
    token in its URL (``https://TOKEN@github.com/...``) must not be stored; an ``@`` in the
    path is no user."""
    errors = _errors({**GOOD, "code": {"kind": "git", "repository": repository, "commit": COMMIT}})
    assert list(errors) == ["code.repository"]
    assert "must not carry credentials" in errors["code.repository"]
    path_at = "https://example.org/acme/train@v1.git"
    assert _job(code={"kind": "git", "repository": path_at, "commit": COMMIT}).code


@pytest.mark.parametrize(
    ("repository", "said"),
    [
        ("https://example.com:99999/x.git", "names the port 99999, which is no port"),
        ("git://example.com:0/x.git", "names the port 0, which is no port"),
        ("https://[2606:4700::1111]/x.git", "its host a name or an IPv4 address"),
    ],
)
def test_a_repository_git_would_refuse_is_refused_saying_why(repository: str, said: str) -> None:
    """git refuses a port out of range: taken here, the job failed on the runner instead. An
    IPv6 address is no host the API takes, and its refusal says so."""
    errors = _errors({**GOOD, "code": {"kind": "git", "repository": repository, "commit": COMMIT}})
    assert list(errors) == ["code.repository"]
    assert said in errors["code.repository"]
    dash_inside = "https://example.com/-x/a-b.git"  # a path, not an option: git takes it
    assert _job(code={"kind": "git", "repository": dash_inside, "commit": COMMIT}).code


@pytest.mark.parametrize(
    ("repository", "named"),
    [
        ("https://169.254.169.254/latest/meta-data", "169.254.169.254, a link-local address"),
        ("https://10.0.0.5/team/x.git", "10.0.0.5, a private address"),
        ("git://127.0.0.1:4222/x", "127.0.0.1, a loopback address"),
        ("https://localhost:9000/x", None),  # a host name: the runner judges it
        ("git://192.168.1.20:2222/x.git", "192.168.1.20, a private address"),
        ("https://100.64.3.3/team/x.git", "100.64.3.3, a shared (CGNAT) address"),
        ("https://2130706433/x.git", "2130706433 (127.0.0.1), a loopback address"),
        ("https://0x7f.1/x.git", "0x7f.1 (127.0.0.1), a loopback address"),
        ("https://0.0.0.0/x.git", "0.0.0.0, the unspecified address"),
        ("https://140.82.112.3/acme/train.git", None),
        ("git://github.com/acme/train.git", None),
    ],
)
def test_a_repository_written_as_an_address_that_is_not_public_is_refused(
    repository: str, named: str | None
) -> None:
    """Runners fetch a job's code in their host's network: an address that is not public
    could only reach the node's own services. A host name is left to the runner, which
    resolves it in its own network (``services.runner.git_remote``)."""
    body = {**GOOD, "code": {"kind": "git", "repository": repository, "commit": COMMIT}}
    if named is None:
        assert _job(code=body["code"]).code
        return
    errors = _errors(body)
    assert list(errors) == ["code.repository"]
    assert (
        f"names the address {named}: the runners fetch code only from public"
        in (errors["code.repository"])
    )


@pytest.mark.parametrize(
    "requirement",
    [
        "mylib @ https://alice:s3cret@pypi.example.com/mylib-1.0-py3-none-any.whl",
        "mylib @ https://ghp_0123456789abcdef@github.com/a/b/mylib-1.0-py3-none-any.whl",
        "mylib@https://token@example.org/mylib-1.0-py3-none-any.whl",
    ],
)
def test_a_wheel_url_with_credentials_is_refused(requirement: str) -> None:
    """The installer would use them, and they would sit in the spec every teammate reads
    and every service's events carry."""
    errors = _errors({**GOOD, "requirements": ["numpy", requirement]})
    assert list(errors) == ["requirements[1]"]
    assert "must not carry credentials" in errors["requirements[1]"]
    assert "s3cret" not in errors["requirements[1]"]
    at_in_path = "mylib @ https://example.org/a@b/mylib-1.0-py3-none-any.whl"
    assert _job(requirements=[at_in_path]).to_spec("a", "ml").requirements == [at_in_path]


@pytest.mark.parametrize(
    ("requirement", "named"),
    [
        ("x @ https://169.254.169.254/x-1.0-py3-none-any.whl", "169.254.169.254, a link-local"),
        ("x @ https://10.0.0.5:9000/x-1.0-py3-none-any.whl", "10.0.0.5, a private address"),
        ("x @ https://127.1/x-1.0-py3-none-any.whl", "127.1 (127.0.0.1), a loopback address"),
        ("x @ https://[::1]:8222/x-1.0-py3-none-any.whl", "::1, a loopback address"),
        ("x @ https://localhost:8222/x-1.0-py3-none-any.whl", None),  # the runner judges it
        ("x @ https://140.82.112.3/x-1.0-py3-none-any.whl", None),
    ],
)
def test_a_wheel_url_written_as_an_address_that_is_not_public_is_refused(
    requirement: str, named: str | None
) -> None:
    """The runner fetches a wheel in its host's network, as git a repository:
    an address that is not public could only reach the node's own services. A host name is
    left to the runner, which resolves it in its own network before installing."""
    if named is None:
        assert _job(requirements=[requirement]).requirements == [requirement]
        return
    errors = _errors({**GOOD, "requirements": ["numpy", requirement]})
    assert list(errors) == ["requirements[1]"]
    assert (
        f"a URL names the address {named}" in errors["requirements[1]"]
        and "the runners fetch wheels only from public addresses" in errors["requirements[1]"]
    ), errors


@pytest.mark.parametrize(
    ("requirement", "said"),
    [
        ("x @ https://h.example:0/x-1.0-py3-none-any.whl", "port 0"),
        ("x @ https://h.\u212aey.example/x-1.0-py3-none-any.whl", "beyond ASCII"),
    ],
)
def test_a_wheel_url_the_runners_would_read_otherwise_is_refused(
    requirement: str, said: str
) -> None:
    errors = _errors({**GOOD, "requirements": [requirement]})
    assert list(errors) == ["requirements[0]"]
    assert said in errors["requirements[0]"]


@pytest.mark.parametrize(
    "requirement",
    [
        "torch",
        "torch==2.3.1",
        "numpy>=1.26,<3",
        "transformers[torch,sentencepiece]~=4.44",
        "scipy (>=1.11)",
        "pkg_name.sub-part===1.0+local",
        'tomli>=2; python_version < "3.11"',
        "uvloop; sys_platform != 'win32' and platform_machine == 'x86_64'",
        "mylib @ https://example.org/mylib-1.0-py3-none-any.whl#sha256=abc",
    ],
)
def test_requirements_accepted(requirement: str) -> None:
    assert _job(requirements=[requirement]).to_spec("a", "ml").requirements == [requirement]


@pytest.mark.parametrize(
    ("requirement", "says"),
    [
        ("--index-url http://evil", "not a pip option"),
        ("--extra-index-url=http://evil", "not a pip option"),
        ("-e .", "not a pip option"),
        ("-r other.txt", "not a pip option"),
        (" -e .", "not a pip option"),
        ("torch\n--index-url http://evil", "one line"),
        ("torch\r\n", "one line"),
        ("torch\x00", "one line"),
        ("mylib @ file:///etc/passwd", "file: URL"),
        ("mylib @file:../x", "file: URL"),
        ("torch --hash=sha256:abc", "PEP 508"),
        ("torch>= --pre", "PEP 508"),
        ("torch; python_version == 'x --index-url=y'", "PEP 508"),
        ("mylib @ http://insecure/x.whl", "PEP 508"),
        ("mylib @ git+https://github.com/acme/mylib@v1.2", "must name a wheel"),
        ("mylib @ git+ssh://git@github.com/acme/mylib", "must name a wheel"),
        ("mylib @ https://example.org/mylib-1.0.tar.gz", "must name a wheel"),
        ("mylib @ https://example.org/mylib.whl.tar.gz; python_version>'3'", "must name a wheel"),
        ("./local/path", "PEP 508"),
        ("torch\t==2", "PEP 508"),
        ("   ", "blank"),
        ("", "at least 1 character"),
        ("x" * 201, "at most 200 characters"),
    ],
)
def test_requirements_that_could_inject_pip_options_are_refused(
    requirement: str, says: str
) -> None:
    errors = _errors({**GOOD, "requirements": ["numpy", requirement]})
    assert list(errors) == ["requirements[1]"]
    assert says in errors["requirements[1]"]


@pytest.mark.parametrize(
    "requirement", ["requirements.txt", "requirements-dev.txt", "requirements.in", "pyproject.toml"]
)
def test_a_requirement_that_names_a_file_says_to_list_the_packages(requirement: str) -> None:
    """``requirements: [requirements.txt]`` was taken for a package of that name: admitted,
    then the job failed installing it ("requirements.txt was not found in the package
    registry")."""
    assert _errors({**GOOD, "requirements": ["numpy", requirement]}) == {
        "requirements[1]": f"{requirement!r} is a file name, not a package: list the packages "
        "themselves, one item each (the lines of a requirements file)"
    }


@pytest.mark.parametrize("requirement", ["discord.py", "zope.interface", "backports.zoneinfo"])
def test_dotted_package_names_are_packages(requirement: str) -> None:
    assert _job(requirements=[requirement]).requirements == [requirement]


def test_at_most_100_requirements() -> None:
    assert list(_errors({**GOOD, "requirements": ["numpy"] * 101})) == ["requirements"]


@pytest.mark.parametrize(
    "image",
    [
        "python",
        "python:3.11-slim",
        "ghcr.io/acme/train:v1.2",
        "registry.local:5000/team/img",
        "nvcr.io/nvidia/pytorch:24.05-py3",
        "python@sha256:" + "a" * 64,
        "docker.io/library/python:3.11@sha256:" + "b" * 64,
    ],
)
def test_images_accepted(image: str) -> None:
    assert _job(image=image).to_spec("a", "ml").image == image


@pytest.mark.parametrize(
    "image", ["", "Python", "python:", "-rm", "img --privileged", "a" * 301, "img:tag\n"]
)
def test_bad_images_are_named(image: str) -> None:
    assert list(_errors({**GOOD, "image": image})) == ["image"]


def test_patterns_are_fast_on_hostile_input() -> None:
    hostile = [
        "a" * 199 + "!",
        "a-" * 99 + "!",
        "a; " + "(" * 190 + "!",
        "a[" + "b," * 95 + "!",
        "a==" + "1," * 95 + "!",
    ]
    started = time.monotonic()
    for value in hostile:
        _errors({**GOOD, "requirements": [value], "image": value[:300]})
    assert time.monotonic() - started < 1.0
