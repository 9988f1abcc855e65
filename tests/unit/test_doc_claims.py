"""Claims the documents made that the code contradicted, each held to what the code does.

One case per corrected claim: the wrong wording must not come back, and where the code
has a constant or a rule that says the truth, the document is compared with it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _text(name: str) -> str:
    """A document's text with its line breaks and runs of blanks made single spaces."""
    return " ".join((ROOT / name).read_text().split())


def test_a_job_may_fine_tune_a_model_granted_to_its_team() -> None:
    """docs/job-spec.md said `parent_model` names "a model of the job's own team"; admission
    takes a model version the team may read, its own or granted to it
    (``services.submission.data_admission``), as docs/models.md ("Grants") says."""
    from trainyard_platform.services.submission.data_admission import UNREADABLE

    assert "granted" in UNREADABLE
    spec = _text("docs/job-spec.md")
    assert "a model of the job's own team" not in spec
    assert "a model of the job's team or of a team that granted it" in spec


def test_the_dashboard_page_does_not_call_its_routes_the_only_open_ones() -> None:
    """docs/dashboard.md said the dashboard's pages, scripts and config.json "are the only
    routes anyone may fetch without a token"; the probes, ``GET /metrics`` on every service
    and the job spec's schema answer without one too (``shared.access.OPEN_PATHS``;
    docs/security.md lists them, tests/unit/shared/test_api_docs.py holds that list)."""
    from trainyard_platform.shared.access import OPEN_PATHS

    page = _text("docs/dashboard.md")
    assert "the only routes anyone may fetch" not in page
    for path in OPEN_PATHS:
        assert f"GET {path}" in _text("docs/security.md"), path
    assert 'docs/security.md, "HTTP"' in page


def test_the_isolation_guarantee_names_grants_and_operators() -> None:
    """docs/architecture.md's guarantee "tenants are isolated" said "every query filters by
    that team", enforced in "submission": a team reads the models and datasets other teams
    granted it (``services/registry/grants.py``), operators read every team, and every
    service checks the caller (``shared/access.py``), not the submission service alone."""
    [row] = [
        line
        for line in (ROOT / "docs" / "architecture.md").read_text().splitlines()
        if line.startswith("| tenants are isolated |")
    ]
    assert "every query filters by that team" not in row
    for named in ("granted", "operators", "shared/access.py", "services/registry/grants.py"):
        assert named in row, named
    assert (ROOT / "services" / "registry" / "grants.py").exists()


def test_the_containment_guarantee_says_it_needs_a_root_runner() -> None:
    """docs/architecture.md's guarantee "jobs are contained" said every job runs "as its own
    unprivileged uid"; a runner that is not root cannot switch users and runs jobs as
    itself (``services/runner/sandbox.py`` warns at start; security.md lists it under "Not
    covered")."""
    [row] = [
        line
        for line in (ROOT / "docs" / "architecture.md").read_text().splitlines()
        if line.startswith("| jobs are contained |")
    ]
    assert "runs as root" in row
    assert "runs jobs as its own user" in row
    assert "Not covered" in _text("docs/security.md")


def test_the_checkpoint_guarantee_does_not_promise_one_interval() -> None:
    """docs/architecture.md promised "a failure costs at most one checkpoint interval": a job
    resumes from the newest checkpoint whose upload finished, and a node that fails while
    one uploads (the runner uploads them one at a time per job, skipping to the newest,
    ``services/runner/supervisor.py``) loses the interval before it too."""
    text = _text("docs/architecture.md")
    assert "at most one checkpoint interval" not in text
    assert "the work since the last uploaded checkpoint" in text


def test_the_readmes_own_project_example_asks_for_no_package_built_against_torch() -> None:
    """README's "Your own project" spec asked for ``requirements: [timm==1.0.9]``. Run as
    shown (on cpu), the job failed: ``RuntimeError: operator torchvision::nms does not
    exist``. The runner keeps torch out of a job's environment (it comes from the platform,
    ``services.runner.environments``) but installs timm's torchvision at its newest version,
    built against another torch. The example names a requirement that works, and the README
    says what does not."""
    readme = _text("README.md")
    example = readme.split("### Your own project", 1)[1].split("```", 2)[1]
    assert "timm" not in example and "torchvision" not in example
    assert "requirements: [einops==0.8.1]" in example
    assert "built against torch (torchvision, timm, ...)" in readme


def test_the_readme_says_what_a_login_without_the_other_services_urls_leaves_out() -> None:
    """README's quick start logs in with the submission API's URL only and then lists
    ``metrics`` among what a job offers; ``experiments``, ``model``, ``cost`` then stop with
    "no registry URL" or "no billing URL", and ``metrics`` shows only the latest step. The
    README says so and names the options (``trainyard.cli_config.SERVICES``)."""
    from trainyard.cli_config import SERVICES

    readme = _text("README.md")
    for service in ("registry", "billing"):
        assert service in SERVICES
        assert f"`--{service}-url`" in readme
    assert "`metrics` shows only the latest step" in readme


def test_the_alias_limit_does_not_say_the_alias_page_carries_all_of_them() -> None:
    """``models.MAX_ALIASES``'s docstring and docs/models.md ("Aliases") said ``GET
    …/aliases`` answers all of a model's aliases in one body; it is paged (``limit`` 1 to
    500, default 100, ``next``: ``model_api.list_aliases``). What carries all of them is the
    model's detail and its row of ``GET /v1/models``; the limit is 100 a model."""
    from trainyard_platform.services.registry import models

    assert models.MAX_ALIASES == 100
    source = " ".join(Path(models.__file__).read_text().split())
    assert "``GET .../aliases`` answer all of them" not in source
    assert "The most aliases a model may have (100" in source
    page = _text("docs/models.md")
    assert "`GET …/aliases` carry all of them" not in page
    assert "A model has at most 100 aliases" in page


def test_a_job_without_an_experiment_is_a_run_of_the_one_named_after_it() -> None:
    """docs/job-spec.md said `experiment` is "a name ..., or none" and that
    examples/digits.job.json runs "in no experiment"; the registry files a job that names
    none as a run of the experiment named after its ``name``
    (``services.registry.tracking_repository.experiment_name``), as docs/tracking.md says,
    and ``trainyard experiments`` lists it."""
    from trainyard_platform.services.registry.tracking_repository import experiment_name
    from trainyard_platform.shared.events.payloads import JobSpec

    spec = JobSpec.model_construct(name="digits-cnn", experiment=None)
    assert experiment_name(spec) == "digits-cnn"
    page = _text("docs/job-spec.md")
    assert "in no experiment" not in page
    assert "a name like a project's, or none" not in page
    assert "without one, the job is a run of the experiment named after its `name`" in page


def test_ls_after_and_all_are_not_said_to_exclude_each_other() -> None:
    """docs/cli.md's synopsis wrote ``ls [--after C | --all]``, the form it uses for options
    that exclude each other (``--mine | --user U``, which the parser refuses together); ``ls
    --after C --all`` lists every page after C (``cli_jobs.ls``) and the parser takes both."""
    from trainyard.cli import _parser

    args = _parser().parse_args(["ls", "--after", "c", "--all"])
    assert (args.after, args.all) == ("c", True)
    page = _text("docs/cli.md")
    assert "[--after C | --all]" not in page
    assert "[--after C] [--all]" in page


def test_prices_set_is_not_said_to_need_a_gpu_hour_price() -> None:
    """docs/cli.md ("Governance") wrote ``admin prices set FLAVOR --gpu-hour P [--cpu-hour
    P] ...``, as if a GPU-hour price were required; any one price will do (``cli_prices``:
    ``--cpu-hour`` alone sets the CPU-hour price), none is the usage error."""
    from trainyard.cli import _parser

    args = _parser().parse_args(["admin", "prices", "set", "cpu", "--cpu-hour", "0.01"])
    assert args.price_per_gpu_hour is None
    page = _text("docs/cli.md")
    assert "`admin prices set FLAVOR --gpu-hour P" not in page
    assert "`admin prices set FLAVOR [--gpu-hour P] [--cpu-hour P]" in page
    assert "(at least one price" in page


def test_the_jobs_environment_lists_every_variable_the_runner_sets() -> None:
    """docs/job-spec.md ("Inside the job", "Besides them") listed the job's variables but
    left out ``LOGNAME``, ``PYTHONNOUSERSITE``, ``CUDA_DEVICE_ORDER`` and (there)
    ``OMP_NUM_THREADS``, which a job printing its environment sees
    (``services.runner.launch``, ``services.runner.gpus.GpuInventory.job_env``)."""
    source = (ROOT / "services" / "runner" / "launch.py").read_text()
    source += (ROOT / "services" / "runner" / "gpus.py").read_text()
    [besides] = [p for p in _text("docs/job-spec.md").split("Besides them:")[1:]]
    for name in (
        "PATH",
        "HOME",
        "TMPDIR",
        "USER",
        "LOGNAME",
        "LANG",
        "PYTHONUNBUFFERED",
        "PYTHONNOUSERSITE",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "OMP_NUM_THREADS",
        "TRACEPARENT",
    ):
        assert f'"{name}"' in source, name
        assert f"`{name}" in besides, name


def test_a_dry_run_is_not_said_to_find_what_the_scheduler_refuses() -> None:
    """docs/cli.md said ``submit --dry-run`` has the server check the job "exactly as it
    checks a submission", and a spec with an unknown ``priority`` class or an ``image`` got
    ``the job would be accepted``; submitted, it ended FAILED (exit 10) at once: the
    scheduler refuses those on arrival (``services.scheduler.admission``), after the
    submission service's checks, which are all a dry run makes."""
    admission = (ROOT / "services" / "scheduler" / "admission.py").read_text()
    assert "does not exist; existing:" in admission
    assert "runs container images" in admission
    page = _text("docs/cli.md")
    assert "a dry run does not find: it says `would be accepted`" in page


def test_cpus_per_gpu_is_said_to_be_whole_cpus() -> None:
    """docs/job-spec.md gave ``cpus_per_gpu`` "(0 to 1024)" beside "1.5 CPUs" of a quota, and
    ``cpus_per_gpu: 1.5`` is refused (``must be an integer``): the field is whole CPUs
    (``JobSpec.cpus_per_gpu``, the published schema), as ``memory_gib_per_gpu`` is whole
    GiB."""
    import json

    schema = json.loads((ROOT / "client" / "trainyard" / "schemas" / "job.v1.json").read_text())
    assert schema["properties"]["cpus_per_gpu"]["type"] == "integer"
    assert "`cpus_per_gpu` (0 to 1024, whole CPUs)" in _text("docs/job-spec.md")


def test_the_job_spec_says_no_runner_runs_an_image() -> None:
    """docs/job-spec.md did not name ``image``, which the schema offers as "A container image
    to run the job in"; a spec with one is accepted by the API, then refused by the
    scheduler on arrival (``services.scheduler.admission``), so the job ends FAILED at once."""
    admission = (ROOT / "services" / "scheduler" / "admission.py").read_text()
    assert "runs container images" in admission
    page = _text("docs/job-spec.md")
    assert "`image` (a container image to run the job in) is in the schema, but no runner" in page


def test_metrics_without_a_registry_url_is_not_said_to_exit_7() -> None:
    """docs/cli.md listed ``metrics`` among the registry's commands, whose missing URL is
    exit 7; without a registry URL ``metrics JOB`` shows the job's latest step from the
    submission API instead (``cli_tracking.run_metrics``; README's quick start says so),
    and only ``metrics JOB KEY`` stops with "no registry URL"."""
    import inspect

    from trainyard import cli_tracking

    source = inspect.getsource(cli_tracking.run_metrics)
    assert "except CliError:\n        if args.key:\n            raise" in source
    page = _text("docs/cli.md")
    assert "without a registry URL, `metrics JOB` shows the job's latest step" in page


def _bus_section() -> str:
    text = (ROOT / "docs" / "security.md").read_text()
    return text[text.index("\n## Bus\n") :]


def test_the_bus_s_publish_list_names_every_type_each_source_may_say() -> None:
    """docs/security.md ("Bus", "Publish") listed what each service's NATS user may publish
    as "only the event types its source may say (``shared.events.trust``, one table)" but
    left out the scheduler's ``flavor.declared``, ``flavor.retired`` and ``node.supplied``
    and billing's ``budget.updated`` and ``budget.threshold_crossed``, which that table
    gives them and deploy/nats/nats.conf lets them publish."""
    from trainyard_platform.shared.events import trust

    section = _bus_section()
    start = section.index("* **Publish**")
    publish = " ".join(section[start : section.index("\n* **", start + 1)].split())
    for source in (trust.SUBMISSION, trust.SCHEDULER, trust.RUNNER, trust.REGISTRY, trust.BILLING):
        for payload in trust.types_said_by(source):
            name = payload.TYPE.removeprefix("trainyard.").removesuffix(".v1")
            family = name.split(".")[0] + ".*"
            assert f"`{name}`" in publish or f"`{family}`" in publish, (source, name)


def test_the_bus_s_open_points_are_under_not_done_yet() -> None:
    """The "Duplicate ids" paragraph of docs/security.md ("Bus") was put between the "Not
    done yet" bullet and its last two points, so "An epoch is checked against what the node
    itself saw" and "Upgrading a running platform ... dead-letters what was in flight" read
    as points of "Duplicate ids", a part that is done."""
    section = _bus_section()
    start = section.index("* **Not done yet:**")
    for point in ("  * An epoch is checked against what the node itself saw", "  * Upgrading"):
        at = section.index(point, start)
        assert "\n* **" not in section[start:at], point


def test_dev_py_test_is_said_to_run_the_whole_gate() -> None:
    """docs/operations.md ("Chaos") said "``python3 dev.py test`` runs the short chaos
    suite"; it runs the whole gate (``ruff format --check``, ``ruff check``, mypy,
    lint-imports, then every test: dev.py ``cmd_test``), the chaos suite among the tests."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    assert "gate" in dev.TARGETS["test"][1]
    page = _text("docs/operations.md")
    assert "`python3 dev.py test` runs the short chaos suite" not in page
    assert "`python3 dev.py test` runs the whole gate" in page
    assert "the short chaos suite included (`tests/chaos/`" in page


def test_the_body_limit_is_said_of_every_json_body() -> None:
    """docs/security.md ("Input limits") said "``POST /v1/jobs`` and ``POST /v1/admin/users``
    accept at most 64 KiB of JSON", as if no other body were bounded; every JSON body of
    every service is read by ``shared.http_errors.read_json_body`` with a limit of 64 KiB
    (each service's ``*BODY_MAX_BYTES``), 413 past it."""
    import math
    import re

    limits = {
        f"{path.relative_to(ROOT)}:{name}": math.prod(int(n) for n in value.split("*"))
        for path in sorted((ROOT / "services").rglob("*.py"))
        for name, value in re.findall(
            r"^([A-Z_]*BODY_MAX_BYTES)\s*=\s*([\d *]+)$", path.read_text(), re.MULTILINE
        )
    }
    assert len(limits) >= 6, limits
    assert set(limits.values()) == {64 * 1024}, limits
    page = _text("docs/security.md")
    assert "`POST /v1/jobs` and `POST /v1/admin/users` accept at most 64 KiB" not in page
    assert "every JSON body of every service is read by one function" in page


def test_the_scheduler_s_routes_table_has_every_route(tmp_path: Path) -> None:
    """docs/operations.md ("The scheduler's routes") said it lists "every route of the
    scheduler's API" and left out its dead-letter routes (``shared.deadletters``), which
    the scheduler serves as every service does."""
    import re

    from tests.unit.shared.test_api_docs import operations

    doc = (ROOT / "docs" / "operations.md").read_text()
    table = doc[doc.index("\n## The scheduler's routes\n") : doc.index("\n## Reading the queue\n")]
    routes = [(m, p) for service, m, p in operations(tmp_path) if service == "scheduler"]
    assert len(routes) >= 20
    for method, path in routes:
        template = re.sub(r"\\\{[^}]*\\\}", r"\\{[^}/]+\\}", re.escape(path))
        assert re.search(rf"{method} {template}(?![\w/{{])", table), f"{method} {path}"


def test_an_s3_endpoint_is_said_to_be_tried_as_often_as_it_is() -> None:
    """docs/operations.md ("Settings") said a service that cannot reach its S3 endpoint at
    start tries it "5 times first"; the client's pool retries 5 times
    (``client_from_settings``: ``Retry(total=5)``), so it is tried 6 times (6 requests
    counted against an endpoint answering 503)."""
    from trainyard.storage.s3 import client_from_settings
    from trainyard.storage.settings import StorageSettings

    client = client_from_settings(StorageSettings())
    retries = client._http.connection_pool_kw["retries"]
    page = _text("docs/operations.md")
    assert "tried 5 times first" not in page
    assert f"tried {retries.total + 1} times first: a first try and {retries.total} retries" in page


def test_a_second_runner_with_the_node_s_id_is_not_said_to_be_refused(tmp_path: Path) -> None:
    """docs/operations.md ("Scaling each service") said a second runner with one node id on
    the same host "refuses to start: it cannot take the node's job uid range". With derived
    job uids (the default) it takes the next free range (``sandbox.claim_job_uids``), as
    side-by-side local stacks rely on; only a range set in ``JOB_UID_BASE`` is refused."""
    import pytest

    from trainyard_platform.services.runner.config import Settings
    from trainyard_platform.services.runner.sandbox import UidsInUse, claim_job_uids

    derived = Settings(node_id="gpu-07", admin_token="t" * 20).job_uid_choices
    assert len(derived) > 1
    with claim_job_uids(derived, tmp_path) as first:
        with claim_job_uids(derived, tmp_path) as second:
            assert second != first
        with pytest.raises(UidsInUse), claim_job_uids([first], tmp_path):
            pass
    page = _text("docs/operations.md")
    assert "a second one on the same host refuses to start" not in page
    assert "Nothing refuses the second" in page


USER_DOCS = ("README.md", "docs/cli.md", "docs/job-spec.md", "docs/models.md")
USER_DOCS += ("docs/billing.md", "docs/architecture.md")
"""The documents for the platform's users, held to the code by the mechanical checks below."""


def test_every_variable_the_user_documents_name_is_read() -> None:
    """Each ``TRAINYARD_...`` variable the user documents name is one that something reads: a
    service's setting (as docs/operations.md's tables hold them), the CLI's, the object
    store's, or one the runner gives a job (``trainyard.control``); or the name of one of the
    bus's JetStream streams. A ``TRAINYARD_X_…`` is a prefix, not a name."""
    import re

    from pydantic_settings import BaseSettings

    from tests.unit.deploy.test_operations_settings import SETTINGS_READ, read_settings
    from trainyard import control
    from trainyard.cli_base import CliSettings
    from trainyard.storage.settings import StorageSettings
    from trainyard_platform.shared.settings import NatsSettings

    read = {variable for _, variable, _ in SETTINGS_READ}
    settings: tuple[type[BaseSettings], ...] = (CliSettings, StorageSettings)
    read |= {variable for s in settings for variable, _ in read_settings(s)}
    read |= {v for k, v in vars(control).items() if k.startswith("ENV_")}
    nats = NatsSettings()
    read |= {nats.stream, nats.deadletter_stream, nats.attempts_stream}
    named = re.compile(r"\bTRAINYARD_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_…<*])")
    unread = [
        f"{doc}: {variable}"
        for doc in USER_DOCS
        for variable in sorted(set(named.findall((ROOT / doc).read_text())))
        if variable not in read
    ]
    assert unread == []


def test_the_exit_code_table_is_the_cli_s_codes() -> None:
    """docs/cli.md's "Exit codes" table lists every code ``trainyard`` exits with
    (``cli_base.Exit``) and no other."""
    import re

    from trainyard.cli_base import Exit

    section = (ROOT / "docs" / "cli.md").read_text().split("## Exit codes", 1)[1]
    table = re.findall(r"^\| (\d+) \|", section.split("\n\n", 2)[1], flags=re.M)
    assert sorted(int(code) for code in table) == sorted(code.value for code in Exit)


def test_who_owns_what_names_every_event_each_service_consumes() -> None:
    """docs/architecture.md's "Who owns what" table left out the registry's `job.submitted`
    and `allocation.granted` (where it records a fine-tune's parent, docs/models.md) and
    billing's `job.preempted` (a fact of waste); each row's "consumes" names exactly the
    types its service's consumer reads (its ``SUBJECTS``)."""
    import re

    from trainyard_platform.services.billing.handlers import SUBJECTS as BILLING
    from trainyard_platform.services.registry.service import SUBJECTS as REGISTRY
    from trainyard_platform.services.scheduler.service import SUBJECTS as SCHEDULER
    from trainyard_platform.services.submission.service import SUBJECTS as SUBMISSION
    from trainyard_platform.shared.events import EVENT_TYPES

    short = {t: t.removeprefix("trainyard.").removesuffix(".v1") for t in EVENT_TYPES}
    read = {"submission": SUBMISSION, "scheduler": SCHEDULER, "registry": REGISTRY}
    read["billing"] = BILLING
    for service, subjects in read.items():
        [row] = [
            line
            for line in (ROOT / "docs" / "architecture.md").read_text().splitlines()
            if line.startswith(f"| {service} |")
        ]
        consumes = row.split(" | ")[2]
        documented = set(re.findall(r"\b[a-z]+\.[a-z_]+\b", consumes)) & set(short.values())
        consumed = {short[t] for s in subjects for t in short if s.startswith(t + ".")}
        assert documented == consumed, service


def test_billing_does_not_say_the_runner_leaves_cpus_and_memory_unlimited() -> None:
    """docs/billing.md ("CPU and memory") said "the runner does not limit them"; the runner
    gives each attempt a cgroup with a CPU quota and a memory limit from ``cpus_per_gpu`` and
    ``memory_gib_per_gpu`` (``services/runner/cgroups.py``; docs/job-spec.md, "CPUs and
    memory"). Billing meters what was declared, not what was used."""
    cgroups = (ROOT / "services" / "runner" / "cgroups.py").read_text()
    assert "memory.max" in cgroups and "cpu.max" in cgroups
    page = _text("docs/billing.md")
    assert "the runner does not limit them" not in page
    assert "What billing meters is what the job declared, not what it used" in page


def test_the_readme_does_not_say_no_job_is_network_isolated() -> None:
    """README's "What it does not do (yet)" listed "Network isolation of jobs"; a job on one
    node runs in a network namespace holding only its loopback by default
    (``services/runner/netns.py``, ``TRAINYARD_RUNNER_JOB_NETWORK=loopback``, as the README
    itself and docs/job-spec.md, "Network", say). What is not built is a network per gang
    across nodes."""
    from trainyard_platform.services.runner.config import Settings

    assert Settings.model_fields["job_network"].default == "loopback"
    readme = _text("README.md")
    assert "**Network isolation of jobs**" not in readme
    assert "**Network isolation of jobs across nodes**" in readme


def test_the_runner_is_not_said_to_have_a_repository_and_migrations() -> None:
    """docs/architecture.md ("Inside a service") said every service has ``repository.py`` and
    ``migrations/``; the runner keeps no database and has neither."""
    runner = ROOT / "services" / "runner"
    assert not (runner / "repository.py").exists() and not (runner / "migrations").exists()
    for service in ("submission", "scheduler", "registry", "billing"):
        assert (ROOT / "services" / service / "repository.py").exists(), service
        assert (ROOT / "services" / service / "migrations").is_dir(), service
    page = _text("docs/architecture.md")
    assert (
        "the runner, which keeps no database, has no `repository.py` and no `migrations/`" in page
    )


def test_the_readme_s_layout_names_every_page_of_docs() -> None:
    """README's "Layout" gave ``docs/`` as seven pages of its fourteen (no billing.md,
    scheduling.md, datasets.md, lineage.md, tracking.md, reproducibility.md or
    dashboard.md)."""
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```", 2)[1]
    folder = layout[layout.index("\ndocs/") : layout.index("\nbench/")]
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert len(pages) >= 14
    assert [p for p in pages if p not in folder] == []


def test_who_owns_what_has_a_producer_for_every_event() -> None:
    """docs/architecture.md's "Who owns what" table had the registry consume `job.metrics`,
    which no row produced: the runner publishes it (``services/runner/publishing.py``, as
    the diagram above the table and "Experiment tracking" say). Every event type is
    produced by some row, and every type a row consumes is one of them."""
    import re

    from trainyard_platform.shared.events import EVENT_TYPES

    short = {t.removeprefix("trainyard.").removesuffix(".v1") for t in EVENT_TYPES}
    rows = [
        line.split(" | ")
        for line in (ROOT / "docs" / "architecture.md").read_text().splitlines()
        if line.startswith(("| submission |", "| scheduler |", "| runner |", "| registry |"))
        or line.startswith("| billing |")
    ]
    assert len(rows) == 5

    def named(cell: str) -> set[str]:
        return set(re.findall(r"\b[a-z]+\.[a-z_]+\b", cell)) & short

    produced = set().union(*(named(row[3]) for row in rows))
    consumed = set().union(*(named(row[2]) for row in rows))
    assert sorted(short - produced) == []
    assert sorted(consumed - produced) == []
    assert "job.metrics" in named(next(row for row in rows if row[0] == "| runner")[3])


def test_every_file_the_user_documents_name_exists() -> None:
    """Each file a user document names in code with its folder (``services/runner/cgroups.py``,
    ``tests/integration/registry/test_models.py``) is in the repository: from its root, or,
    as the documents name a service's migrations and modules after naming the service, from
    the folder of a service or of ``shared``."""
    import re

    path = re.compile(r"`([\w.-]+(?:/[\w.-]+)+\.(?:py|sql|json|md|yaml|yml|toml))`")
    bases = [ROOT, ROOT / "shared", *(ROOT / "services").iterdir()]
    missing = [
        f"{doc}: {name}"
        for doc in USER_DOCS
        for name in sorted(set(path.findall((ROOT / doc).read_text())))
        if not any((base / name).exists() for base in bases)
    ]
    assert missing == []


def test_the_cli_docs_put_the_environment_before_a_context_s_url_and_token() -> None:
    """docs/cli.md ranked ``--context`` above ``TRAINYARD_URL``/``TRAINYARD_TOKEN``; the CLI
    reads a context, whichever names it, only for what options and variables leave out
    (``cli_base.Command.url`` and ``token``)."""
    page = _text("docs/cli.md")
    assert "Strongest first: `--url`, `--token`, `--context`;" not in page
    assert "`--context prod` still calls that URL with that token" in page
