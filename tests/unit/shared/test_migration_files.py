from pathlib import Path

import pytest

from trainyard_platform.shared.db import migration_files


def test_files_are_ordered(tmp_path: Path) -> None:
    for name in ("0002_b.sql", "0001_a.sql"):
        (tmp_path / name).write_text("SELECT 1;")
    assert [p.name for p in migration_files(tmp_path)] == ["0001_a.sql", "0002_b.sql"]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["0001_a.sql", "0003_c.sql"], "without gaps"),
        (["1_a.sql"], "name must look like"),
    ],
)
def test_bad_sets_are_refused(tmp_path: Path, names: list[str], message: str) -> None:
    for name in names:
        (tmp_path / name).write_text("SELECT 1;")
    with pytest.raises(ValueError, match=message):
        migration_files(tmp_path)


def test_missing_folder_means_no_migrations(tmp_path: Path) -> None:
    assert migration_files(tmp_path / "absent") == []
