"""What a failed git command of a job's code fetch says, as the spec field at fault and
what happened, and whether the job's own input is to blame.

Every reason names ``spec.code.repository`` or ``spec.code.commit``: the job's owner reads
it in the job's history, and the field tells where to look. Only what would fail the same
way on any node at any time is the job's input (``job_input``: ``user_error``, not
retried): a commit the repository lacks, no repository there, one that asks for
credentials, a redirect (never followed: ``git_remote``), a transport git refuses. Everything else may pass and is the platform's
(``platform_error``, retried), its reason naming the field all the same.

A host that git says does not resolve stays the platform's: curl says "Could not resolve
host" of a name that does not exist and of a resolver that failed alike. The runner looks
the host up itself before git runs and tells the two apart there (``git_remote.lookup``: a
name that does not exist is the job's input), then holds git to the address it found: git
looking a host up again is nothing the job's spec did. Its reason says both readings.

None of what follows the repository is held against the node (``node``: the node's cordon,
``sandbox.NodeFault``): the repository, its host and its server are the tenant's choice, a
hostile server says on git's stderr whatever it likes ("remote: No space left on device"
included), and its size fills the disk it is checked out on. So a failure of ``git fetch``,
``checkout`` or ``rev-parse``, or a fetch that runs out of time, is retried as the
platform's but never counts towards a cordon, whatever git said. Only what no repository
can cause is the node's: ``git init`` failing, or git that cannot be started at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GitFault:
    field: str
    """``spec.code.repository`` or ``spec.code.commit``."""
    what: str
    """What happened, in a few words."""
    job_input: bool
    """True when the job's own spec is at fault (``user_error``)."""
    node: bool = False
    """True when this node itself is at fault whatever the repository (counted towards its
    cordon); never together with ``job_input``."""

    def reason(self, detail: str) -> str:
        """``<field>: <what>; <detail>`` (``detail``: the command and git's own words)."""
        return f"{self.field}: {self.what}; {detail}"


REPOSITORY = "spec.code.repository"
COMMIT = "spec.code.commit"
UNRESOLVED = (
    "its host name did not resolve from this node (mistyped, or this node's DNS "
    "failing: the two look the same, so it is retried as the platform's)"
)
"""What a host git says does not resolve is said to be (the runner's own lookup before it
tells more: ``git_remote.lookup``)."""

_FAULTS: tuple[tuple[re.Pattern[str], str, str, bool], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), field, what, job_input)
    for pattern, field, what, job_input in (
        # The job's own input: any node, any time, fails the same way.
        (
            r"not our ref|couldn't find remote ref|unadvertised object",
            COMMIT,
            "the repository has no such commit",
            True,
        ),
        (
            r"does not appear to be a git repository|repository '[^']*' not found"
            r"|returned error: 404|repository not exported|no such repository",
            REPOSITORY,
            "no git repository there",
            True,
        ),
        (
            r"terminal prompts disabled|could not read (username|password)"
            r"|authentication failed",
            REPOSITORY,
            "the repository asks for credentials, and jobs fetch without any",
            True,
        ),
        (
            r"returned error: 30\d",
            REPOSITORY,
            "its server answers with a redirect, which this node does not follow (where it "
            "leads is never checked): name the repository where it now is",
            True,
        ),
        (
            r"transport '[^']*' not allowed|protocol '[^']*' is not supported",
            REPOSITORY,
            "git does not fetch by this transport",
            True,
        ),
        # What may pass: the platform's.
        (
            r"could not resolve host|unable to look up"
            r"|name or service not known|temporary failure in name resolution",
            REPOSITORY,
            UNRESOLVED,
            False,
        ),
        (
            r"no space left on device|disk quota exceeded|read-only file system",
            REPOSITORY,
            "the checkout did not fit on this node's disk (the repository's size, or the "
            "disk full)",
            False,
        ),
        (
            r"failed to connect|connection refused|connection timed out|timed out"
            r"|could not connect|unable to connect|network is unreachable|connection reset",
            REPOSITORY,
            "its host did not answer from this node",
            False,
        ),
        (
            r"returned error: 5\d\d|http 5\d\d|rpc failed",
            REPOSITORY,
            "its server failed to serve the fetch",
            False,
        ),
        (
            r"ssl certificate|certificate verif|server certificate|gnutls|ssl_connect"
            r"|tls connection",
            REPOSITORY,
            "the TLS connection to its host failed from this node",
            False,
        ),
    )
)


def git_fault(command: str, stderr: str) -> GitFault:
    """The fault of a git ``command`` (``init``, ``fetch``, ``checkout``, ``rev-parse``)
    that failed saying ``stderr``: the first rule that matches, else the field the command
    works on (the repository for ``init`` and ``fetch``, the commit after) and the
    platform's. Only ``init`` is the node's (``GitFault.node``): it runs before anything of
    the repository is fetched."""
    if command == "init":
        return GitFault(REPOSITORY, "git init failed on this node", False, node=True)
    for pattern, field, what, job_input in _FAULTS:
        if pattern.search(stderr):
            return GitFault(field, what, job_input)
    if command == "fetch":
        return GitFault(REPOSITORY, f"git {command} failed on this node", False)
    return GitFault(COMMIT, f"git {command} of the fetched commit failed on this node", False)


def git_not_run(command: str, problem: str, *, timed_out: bool = False) -> GitFault:
    """The fault of a git ``command`` that could not be run or did not finish
    (``problem``: the ``OSError`` or the timeout): the platform's; the node's
    (``GitFault.node``) unless it ran out of time after ``init``, which the repository's
    size or a server that answers slowly makes it do."""
    field = REPOSITORY if command in ("init", "fetch") else COMMIT
    what = f"git {command} could not run to its end on this node ({problem})"
    return GitFault(field, what, False, node=command == "init" or not timed_out)
