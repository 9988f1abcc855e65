"""The runner closes its work folder to its jobs at start, whatever was there before."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_the_job_logs_folder_is_closed_even_when_it_was_open(tmp_path: Path) -> None:
    """A work folder made by an older runner, or under a lax umask: every job's output lies
    under ``jobs/``, so a ``jobs/`` left 0755 would let each job read all the others'."""
    work = tmp_path / "work"
    (work / "jobs").mkdir(parents=True)
    (work / "jobs").chmod(0o755)
    work.chmod(0o755)
    # In a process of its own: protect_runner makes its caller non-dumpable.
    code = (
        "from pathlib import Path; from pydantic import SecretStr;"
        "from trainyard_platform.services.runner.config import Settings;"
        "from trainyard_platform.services.runner.service import protect_runner;"
        f"protect_runner(Settings(work_dir=Path({str(work)!r}), admin_token=SecretStr('t')))"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
    assert stat.S_IMODE(work.stat().st_mode) == 0o711
    assert stat.S_IMODE((work / "jobs").stat().st_mode) == 0o700
