"""What the client distribution defines, the platform names but never defines again: the
services' ``shared`` modules hand out the very objects of ``trainyard`` (so a job and a
service can never disagree on the control protocol, a checkpoint reference, a key rule or
the storage settings)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shared.control
import shared.events.payloads
import shared.settings
import shared.storage
import shared.storage.base
import shared.storage.local
import shared.storage.s3
import shared.suggest
import shared.telemetry
import trainyard.control
import trainyard.storage
import trainyard.storage.base
import trainyard.storage.s3
import trainyard.storage.settings
import trainyard.suggest
import trainyard.tracing


@pytest.mark.parametrize(
    ("platform", "client"),
    [
        (shared.control, trainyard.control),
        (shared.storage, trainyard.storage),
        (shared.storage.base, trainyard.storage.base),
        (shared.storage.s3, trainyard.storage.s3),
        (shared.suggest, trainyard.suggest),
    ],
    ids=lambda module: module.__name__,
)
def test_every_name_the_platform_module_exports_is_the_clients(platform, client) -> None:
    # shared.storage also exports S3Store, which the client keeps in trainyard.storage.s3
    # (checked below): importing trainyard.storage must not need MinIO's client.
    names = [n for n in platform.__all__ if not (platform is shared.storage and n == "S3Store")]
    assert names
    for name in names:
        assert getattr(platform, name) is getattr(client, name), name


def test_the_control_protocol_is_whole_under_both_names() -> None:
    """Everything ``trainyard.control`` defines at its top level, ``shared.control`` names."""
    tree = ast.parse(Path(trainyard.control.__file__).read_text())
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
    public = {name for name in defined if not name.startswith("_")}
    assert "JobRuntimeEnv" in public
    assert public == set(shared.control.__all__)


def test_the_shared_models_and_helpers_are_one_object() -> None:
    assert shared.events.payloads.CheckpointRef is trainyard.control.CheckpointRef
    assert shared.events.payloads.HyperValue is trainyard.control.HyperValue
    assert shared.settings.StorageSettings is trainyard.storage.settings.StorageSettings
    assert shared.storage.local.LocalStore is trainyard.storage.LocalStore
    assert shared.storage.S3Store is trainyard.storage.s3.S3Store
    assert shared.telemetry.inject is trainyard.tracing.inject
