"""The runner's pure rules: ids, throttling, control messages -> events, outcomes."""

from __future__ import annotations

import signal
from datetime import UTC, datetime

import pytest

from trainyard_platform.services.runner import domain
from trainyard_platform.services.runner.domain import (
    AllocationState,
    IllegalTransition,
    JobIdentity,
    JobResults,
    LogTail,
    Outcome,
    ProgressThrottle,
    StopRequest,
)
from trainyard_platform.services.runner.process import OUTPUT_LINE_LIMIT
from trainyard_platform.shared.control import CheckpointMessage, MetricsMessage, parse_control_line
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import (
    CheckpointRef,
    CheckpointSaved,
    JobFailed,
    JobPreempted,
    JobProgress,
    JobSucceeded,
)

JOB = JobIdentity("job-1", "alloc-1", "node-a", epoch=4, attempt=2)
NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
REF = CheckpointRef(
    uri="file:///s/jobs/job-1/checkpoints/step-00000010/checkpoint.pt",
    manifest_uri="file:///s/jobs/job-1/checkpoints/step-00000010/manifest.json",
    step=10,
    size_bytes=5,
    sha256="0" * 64,
)


# --- event ids -------------------------------------------------------------------------


def test_event_ids_are_deterministic_and_distinct_per_kind_and_step() -> None:
    assert domain.event_id("alloc-1", "end") == domain.event_id("alloc-1", "end")
    ids = {
        domain.event_id("alloc-1", "end"),
        domain.event_id("alloc-2", "end"),
        domain.event_id("alloc-1", "started"),
        domain.event_id("alloc-1", "progress", 1),
        domain.event_id("alloc-1", "progress", 2),
    }
    assert len(ids) == 5


def test_progress_ids_tell_apart_different_reports_at_one_step() -> None:
    loss = MetricsMessage(step=100, metrics={"loss": 0.5})
    accuracy = MetricsMessage(step=100, metrics={"val_accuracy": 0.9})
    assert domain.progress_event_id(JOB, loss) != domain.progress_event_id(JOB, accuracy)
    again = MetricsMessage(step=100, metrics={"loss": 0.5})
    assert domain.progress_event_id(JOB, loss) == domain.progress_event_id(JOB, again)


# --- throttling ------------------------------------------------------------------------


def test_throttle_lets_the_first_through_and_holds_back_the_rest_of_the_interval() -> None:
    throttle: ProgressThrottle[int] = ProgressThrottle(1.0)
    assert throttle.offer(1, now=10.0) == 1
    assert throttle.offer(2, now=10.2) is None
    assert throttle.offer(3, now=10.5) is None
    assert throttle.next_due() == 11.0
    assert throttle.due(10.9) is None
    assert throttle.due(11.0) == 3  # the newest held back, never the older one
    assert throttle.due(11.5) is None
    assert throttle.next_due() is None


def test_throttle_counts_a_released_item_as_sent() -> None:
    throttle: ProgressThrottle[int] = ProgressThrottle(1.0)
    throttle.offer(1, now=0.0)
    throttle.offer(2, now=0.5)
    assert throttle.due(1.0) == 2
    assert throttle.offer(3, now=1.5) is None  # 2 went out at 1.0
    assert throttle.offer(4, now=2.0) == 4


def test_throttle_flush_hands_out_the_held_item_at_the_end() -> None:
    throttle: ProgressThrottle[int] = ProgressThrottle(1.0)
    throttle.offer(1, now=0.0)
    throttle.offer(2, now=0.1)
    assert throttle.flush() == 2
    assert throttle.flush() is None


def test_throttle_with_zero_interval_passes_everything() -> None:
    throttle: ProgressThrottle[int] = ProgressThrottle(0.0)
    assert [throttle.offer(i, now=5.0) for i in range(3)] == [0, 1, 2]


# --- control messages -> events ----------------------------------------------------------


def test_a_metrics_line_becomes_job_progress() -> None:
    message = parse_control_line(b'{"kind": "metrics", "step": 7, "metrics": {"loss": 0.25}}\n')
    assert isinstance(message, MetricsMessage)
    event = domain.progress_event(JOB, message)
    assert event == JobProgress(
        job_id="job-1", allocation_id="alloc-1", step=7, metrics={"loss": 0.25}, node_id="node-a"
    )


def test_a_checkpoint_line_becomes_checkpoint_saved_with_the_allocation_epoch() -> None:
    message = parse_control_line(CheckpointMessage(checkpoint=REF).encode())
    assert isinstance(message, CheckpointMessage)
    event = domain.checkpoint_event(JOB, message, NOW)
    assert event == CheckpointSaved(
        job_id="job-1",
        allocation_id="alloc-1",
        epoch=4,
        checkpoint=REF,
        saved_at=NOW,
        node_id="node-a",
    )
    other = CheckpointMessage(checkpoint=REF.model_copy(update={"uri": "file:///elsewhere"}))
    assert domain.checkpoint_event_id(JOB, message) != domain.checkpoint_event_id(JOB, other)


# --- outcomes ----------------------------------------------------------------------------

REVOKED = StopRequest("revoked", "preempted")
CANCELLED = StopRequest("revoked", "cancelled")


@pytest.mark.parametrize(
    ("exit_code", "stop", "expected"),
    [
        (0, None, Outcome("succeeded", "exited with status 0", 0)),
        (0, REVOKED, Outcome("succeeded", "exited with status 0", 0)),
        (75, REVOKED, Outcome("preempted", "preempted", 75)),
        (75, CANCELLED, Outcome("preempted", "cancelled", 75)),
        (-9, REVOKED, Outcome("preempted", "preempted", -9)),
        (75, domain.shutdown_stop(), Outcome("preempted", "runner shutting down", 75)),
        (1, None, Outcome("failed", "exited with status 1", 1, "user_error")),
        (
            -9,
            None,
            Outcome(
                "failed",
                "killed by SIGKILL, likely out of memory: no cgroup to confirm",
                -9,
                "out_of_memory",
            ),
        ),
        (
            0,
            domain.max_runtime_stop(60),
            Outcome(
                "failed",
                "max runtime exceeded (60 s, counted from its grant, its preparation included)",
                0,
                "max_runtime",
            ),
        ),
        (
            75,
            domain.max_runtime_stop(60),
            Outcome(
                "failed",
                "max runtime exceeded (60 s, counted from its grant, its preparation included)",
                75,
                "max_runtime",
            ),
        ),
        (
            -9,
            StopRequest("platform", "the runner could not record the job's process"),
            Outcome(
                "failed",
                "the runner could not record the job's process",
                -9,
                "platform_error",
                node_fault=True,  # the runner's own failure: the node's
            ),
        ),
        (
            0,
            StopRequest("platform", "the runner could not record the job's process"),
            Outcome(
                "failed",
                "the runner could not record the job's process",
                0,
                "platform_error",
                node_fault=True,
            ),
        ),
    ],
)
def test_decide_outcome(exit_code: int, stop: StopRequest | None, expected: Outcome) -> None:
    assert domain.decide_outcome(exit_code, stop) == expected


def test_exit_75_without_a_stop_request_is_a_failure_that_says_so() -> None:
    outcome = domain.decide_outcome(75, None)
    assert outcome.kind == "failed"
    assert "never asked it to stop" in outcome.reason


def test_describe_exit() -> None:
    assert domain.describe_exit(None) == "did not start"
    assert domain.describe_exit(2) == "exited with status 2"
    assert domain.describe_exit(-int(signal.SIGTERM)) == "killed by SIGTERM"
    assert domain.describe_exit(-200) == "killed by signal 200"


RESULTS = JobResults({"loss": 0.1, "val_accuracy": 0.9}, REF, "line 1\nline 2")


def test_terminal_event_of_a_success_carries_metrics_and_artifact() -> None:
    event = domain.terminal_event(JOB, Outcome("succeeded", "ok", 0), RESULTS, NOW)
    assert event == JobSucceeded(
        job_id="job-1",
        allocation_id="alloc-1",
        node_id="node-a",
        epoch=4,
        finished_at=NOW,
        metrics={"loss": 0.1, "val_accuracy": 0.9},
        artifact=REF,
    )


def test_terminal_event_of_a_failure_carries_exit_code_reason_and_log_tail() -> None:
    event = domain.terminal_event(JOB, Outcome("failed", "exited with status 3", 3), RESULTS, NOW)
    assert isinstance(event, JobFailed)
    assert (event.exit_code, event.reason, event.log_tail) == (
        3,
        "exited with status 3",
        "line 1\nline 2",
    )


def test_terminal_event_of_a_preemption_carries_the_last_checkpoint() -> None:
    event = domain.terminal_event(JOB, Outcome("preempted", "cancelled", 75), RESULTS, NOW)
    assert isinstance(event, JobPreempted)
    assert (event.reason, event.checkpoint) == ("cancelled", REF)


def test_a_lost_job_is_reported_preempted_so_it_resumes() -> None:
    event = domain.lost_on_restart(JOB, NOW)
    assert isinstance(event, JobPreempted)
    assert event.checkpoint is None and event.reason.startswith("lost")


def test_failed_to_start_has_no_exit_code() -> None:
    event = domain.failed_to_start(JOB, "GPU indices [5] do not exist", NOW)
    assert event.exit_code is None and event.reason == "GPU indices [5] do not exist"


# --- states and tails ----------------------------------------------------------------------


def test_allocation_states_only_move_forward() -> None:
    launched, ending, finished = (
        AllocationState.LAUNCHED,
        AllocationState.ENDING,
        AllocationState.FINISHED,
    )
    assert launched.check(ending) is ending
    assert ending.check(finished) is finished
    assert finished.is_terminal and not ending.is_terminal
    for old, new in ((launched, finished), (finished, ending), (ending, launched)):
        with pytest.raises(IllegalTransition):
            old.check(new)


def test_log_tail_keeps_the_last_lines() -> None:
    tail = LogTail(3)
    for i in range(10):
        tail.add(f"line {i}")
    assert tail.text() == "line 7\nline 8\nline 9"


def test_the_log_tail_of_any_output_fits_an_event_every_consumer_stores() -> None:
    # A job that printed 40 lines of 64 KiB (a tensor, a progress bar without newlines) and
    # failed: before, its job.failed was 2.5 MB (15 MB of JSON for control characters),
    # past NATS's 1 MiB, so the runner published it again every 10 s for ever and the job
    # never ended; and a NUL in its last lines made submission and the scheduler, whose
    # databases store no NUL, dead-letter the job's end.
    tail = LogTail(40)
    for _ in range(41):
        tail.add("\x01" * OUTPUT_LINE_LIMIT)
    tail.add("last words\x00 here")
    results = JobResults({}, None, tail.text())
    event = domain.terminal_event(JOB, Outcome("failed", "exited with status 1", 1), results, NOW)
    body = Envelope.wrap(event, source=domain.SOURCE, subject=JOB.job_id).to_json()
    assert len(body) < 256 * 1024
    assert b"\\u0000" not in body
    assert isinstance(event, JobFailed) and event.log_tail.endswith("\nlast words\ufffd here")
    assert len(event.log_tail) == domain.MAX_LOG_TAIL_CHARS


def test_a_reason_quoting_what_a_tenant_sent_holds_no_nul() -> None:
    # git's words on a failed fetch come from the tenant's server.
    event = domain.failed_to_start(JOB, "spec.code.repository: git fetch failed: bad\x00", NOW)
    assert event.reason == "spec.code.repository: git fetch failed: bad\ufffd"


def test_non_finite_metrics_are_left_out_of_events_so_consumers_can_parse_them() -> None:
    message = MetricsMessage(step=3, metrics={"loss": float("nan"), "lr": 0.1, "g": float("inf")})
    event = domain.progress_event(JOB, message)
    assert event.metrics == {"lr": 0.1}
    results = JobResults({"loss": float("nan"), "acc": 0.5}, None, "")
    done = domain.terminal_event(JOB, Outcome("succeeded", "ok", 0), results, NOW)
    assert isinstance(done, JobSucceeded) and done.metrics == {"acc": 0.5}


def test_a_job_that_waits_on_input_is_flagged_with_the_gpu_time_it_wasted() -> None:
    assert domain.input_bound_metrics(domain.RunningMean(), 100.0, 2) == {}
    busy = domain.input_bound_metrics(domain.RunningMean.of([0.1, 0.2]), 100.0, 2)
    assert busy == {"data_wait_fraction_mean": pytest.approx(0.15)}
    starved = domain.input_bound_metrics(domain.RunningMean.of([0.5, 0.7]), 100.0, 2)
    assert starved["input_bound"] == 1.0
    assert starved["gpu_seconds_waiting_for_data"] == pytest.approx(0.6 * 100 * 2)


def test_the_runner_s_measurements_are_its_own_not_the_job_s_metrics() -> None:
    """Billing prices idle and input-bound GPU time by ``gpu_utilization_mean`` and
    ``data_wait_fraction_mean`` of the end report. A job that logged metrics of those names
    itself (or ``input_bound``) had them published as the runner's measurement wherever
    the runner measured none (a node without NVML, a job reading no data through the SDK),
    so it could report itself busy and fed. Only the runner's own figures are said."""
    claimed = {
        "loss": 0.1,
        "gpu_utilization_mean": 99.0,
        "data_wait_fraction_mean": 0.0,
        "input_bound": 0.0,
        "gpu_seconds_waiting_for_data": 0.0,
    }
    assert domain.end_metrics(claimed, domain.RunningMean(), domain.RunningMean(), 100.0, 2) == {
        "loss": 0.1
    }
    measured = domain.end_metrics(
        claimed, domain.RunningMean.of([1.0, 3.0]), domain.RunningMean.of([0.5, 0.7]), 100.0, 2
    )
    assert measured == {
        "loss": 0.1,
        "gpu_utilization_mean": 2.0,
        "data_wait_fraction_mean": pytest.approx(0.6),
        "input_bound": 1.0,
        "gpu_seconds_waiting_for_data": pytest.approx(0.6 * 100 * 2),
    }


def test_a_failure_and_a_preemption_carry_what_was_measured_finite_only() -> None:
    """Billing's waste figures read the attempt's utilisation and data wait from them."""
    measured = JobResults(
        {"gpu_utilization_mean": 3.5, "data_wait_fraction_mean": 0.4, "loss": float("nan")},
        None,
        "",
    )
    for outcome in (Outcome("failed", "exited with status 1", 1), Outcome("preempted", "x", 75)):
        event = domain.terminal_event(JOB, outcome, measured, NOW)
        assert isinstance(event, JobFailed | JobPreempted)
        assert event.metrics == {"gpu_utilization_mean": 3.5, "data_wait_fraction_mean": 0.4}


def test_a_job_that_never_ran_by_its_own_fault_fails_as_a_user_error() -> None:
    event = domain.failed_to_start(JOB, "requirements cannot be met", NOW, "user_error")
    assert (event.failure_kind, event.exit_code) == ("user_error", None)
    assert domain.failed_to_start(JOB, "disk full", NOW).failure_kind == "platform_error"


TORCHRUN_TAIL = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-05_23:00:20
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 13940)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 13940
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-05_23:00:20
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : {code} (pid: 13941)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_under_torchrun_the_failure_names_the_workers_exit_code() -> None:
    # torchrun exits 1 whatever its worker did: a worker's sys.exit(3) was recorded as
    # "exited with status 1", and a worker the OOM killer took as a user_error.
    outcome = domain.decide_outcome(1, None, TORCHRUN_TAIL.format(code=3), torchrun=True)
    assert outcome == Outcome(
        "failed",
        "rank 1: exited with status 3 (torchrun exited with status 1)",
        3,
        "user_error",
    )
    killed = domain.decide_outcome(1, None, TORCHRUN_TAIL.format(code=-9), torchrun=True)
    assert (killed.exit_code, killed.failure_kind) == (-9, "out_of_memory")
    assert killed.reason.startswith(
        "rank 1: killed by SIGKILL, likely out of memory: no cgroup to confirm"
    )
    # With the attempt's cgroup recording no OOM kill, the worker's SIGKILL was not one.
    watched = domain.decide_outcome(
        1, None, TORCHRUN_TAIL.format(code=-9), torchrun=True, memory=domain.MemoryEvidence()
    )
    assert (watched.exit_code, watched.failure_kind) == (-9, "user_error")
    # Without torchrun, or without its report, the process's own exit code stands.
    plain = domain.decide_outcome(1, None, TORCHRUN_TAIL.format(code=3))
    assert plain == Outcome("failed", "exited with status 1", 1, "user_error")
    silent = domain.decide_outcome(1, None, "Traceback: boom", torchrun=True)
    assert silent == Outcome("failed", "exited with status 1", 1, "user_error")


# --- a checkpoint left unuploaded at the job's end ---------------------------------------


def test_a_success_whose_final_checkpoint_was_not_uploaded_fails_as_the_platforms() -> None:
    """It succeeded with the older checkpoint as its artifact, which the registry
    registered as the model, and nobody was told the final one was lost."""
    lost = domain.LostCheckpoint(20, "object store unreachable", 900.0)
    outcome = domain.with_lost_checkpoint(domain.Outcome("succeeded", "", 0), lost, REF)
    assert outcome.kind == "failed"
    assert outcome.failure_kind == "platform_error"
    assert "checkpoint of step 20 could not be uploaded" in outcome.reason
    assert "within 900 s (object store unreachable)" in outcome.reason
    assert "the latest uploaded is step 10" in outcome.reason
    event = domain.terminal_event(JOB, outcome, domain.JobResults({}, REF, ""), NOW)
    assert isinstance(event, JobFailed)


def test_a_success_whose_final_checkpoint_was_too_slow_to_upload_is_the_jobs_failure() -> None:
    """A job that succeeded but whose final checkpoint was still uploading, with no error
    from the store, when the runner's wait ran out was ended as the platform's error: its
    attempt and the retries were free to its team, so a job could ride free on a huge
    final checkpoint of its own making. The store took every request: the size is the
    job's, so it fails as the job's own error (billed to its team, on its max_restarts)."""
    lost = domain.LostCheckpoint(20, "TimeoutError", 900.0, store_failed=False)
    outcome = domain.with_lost_checkpoint(domain.Outcome("succeeded", "", 0), lost, REF)
    assert outcome.kind == "failed"
    assert outcome.failure_kind == "user_error"
    assert "checkpoint of step 20 was still uploading after 900 s" in outcome.reason
    assert "too large to upload in that time" in outcome.reason
    assert "the latest uploaded is step 10" in outcome.reason
    event = domain.terminal_event(JOB, outcome, domain.JobResults({}, REF, ""), NOW)
    assert isinstance(event, JobFailed)
    assert event.failure_kind == "user_error"
    # The store's own failure stays the platform's, as before.
    failed_store = domain.LostCheckpoint(20, "connection refused", 900.0, store_failed=True)
    outcome = domain.with_lost_checkpoint(domain.Outcome("succeeded", "", 0), failed_store, REF)
    assert outcome.failure_kind == "platform_error"


def test_other_outcomes_keep_their_kind_and_say_which_checkpoint_was_lost() -> None:
    lost = domain.LostCheckpoint(20, "timed out", 5.0)
    outcome = domain.with_lost_checkpoint(domain.Outcome("preempted", "cancelled", 75), lost, None)
    assert outcome.kind == "preempted"
    assert outcome.reason.startswith("cancelled; its checkpoint of step 20 could not be")
    assert outcome.reason.endswith("none of its checkpoints was uploaded")
    unchanged = domain.Outcome("succeeded", "", 0)
    assert domain.with_lost_checkpoint(unchanged, None, REF) is unchanged


# --- a final checkpoint the runner refused ------------------------------------------------


def test_a_success_whose_final_checkpoint_was_refused_fails_as_the_jobs_own_error() -> None:
    """It succeeded with the older checkpoint as its artifact, which the registry
    registered as the model; the refusal was said only in a warning."""
    refused = domain.RefusedCheckpoint(20, "checkpoint.pt is a hard link (2 names)")
    outcome = domain.with_refused_checkpoint(domain.Outcome("succeeded", "", 0), refused, REF)
    assert outcome.kind == "failed"
    assert outcome.failure_kind == "user_error"
    assert outcome.exit_code == 0
    assert "its final checkpoint, of step 20, was refused" in outcome.reason
    assert "(checkpoint.pt is a hard link (2 names))" in outcome.reason
    assert "the latest valid checkpoint is step 10" in outcome.reason
    event = domain.terminal_event(JOB, outcome, domain.JobResults({}, REF, ""), NOW)
    assert isinstance(event, JobFailed)
    assert event.failure_kind == "user_error"


def test_a_refused_final_checkpoint_with_none_valid_before_says_so() -> None:
    refused = domain.RefusedCheckpoint(3, "manifest of step 3 is invalid")
    outcome = domain.with_refused_checkpoint(domain.Outcome("succeeded", "", 0), refused, None)
    assert outcome.kind == "failed" and outcome.failure_kind == "user_error"
    assert outcome.reason.endswith("none of its checkpoints was valid")


def test_other_outcomes_keep_their_kind_and_say_which_checkpoint_was_refused() -> None:
    refused = domain.RefusedCheckpoint(20, "too large")
    preempted = domain.with_refused_checkpoint(
        domain.Outcome("preempted", "cancelled", 75), refused, REF
    )
    assert preempted.kind == "preempted"
    assert preempted.reason.startswith("cancelled; its final checkpoint, of step 20, was")
    failed = domain.Outcome("failed", "exited with status 3", 3, "user_error")
    told = domain.with_refused_checkpoint(failed, refused, REF)
    assert (told.kind, told.failure_kind, told.exit_code) == ("failed", "user_error", 3)
    assert "of step 20, was refused by the runner (too large)" in told.reason
    unchanged = domain.Outcome("succeeded", "", 0)
    assert domain.with_refused_checkpoint(unchanged, None, REF) is unchanged


def test_a_refused_checkpoint_older_than_the_kept_one_changes_nothing() -> None:
    """A newer valid checkpoint supersedes the one refused: the artifact is the newest."""
    refused = domain.RefusedCheckpoint(5, "bad manifest")
    unchanged = domain.Outcome("succeeded", "", 0)
    assert domain.with_refused_checkpoint(unchanged, refused, REF) is unchanged
