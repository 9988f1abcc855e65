"""What the client distribution defines, the platform names but never defines again: the
services' ``shared`` modules hand out the very objects of ``trainyard`` (so a job and a
service can never disagree on the control protocol, a checkpoint reference, a key rule or
the storage settings)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import trainyard.control
import trainyard.storage
import trainyard.storage.base
import trainyard.storage.s3
import trainyard.storage.settings
import trainyard.suggest
import trainyard.tracing
import trainyard_platform.shared.control
import trainyard_platform.shared.events.payloads
import trainyard_platform.shared.settings
import trainyard_platform.shared.storage
import trainyard_platform.shared.storage.base
import trainyard_platform.shared.storage.local
import trainyard_platform.shared.storage.s3
import trainyard_platform.shared.suggest
import trainyard_platform.shared.telemetry


@pytest.mark.parametrize(
    ("platform", "client"),
    [
        (trainyard_platform.shared.control, trainyard.control),
        (trainyard_platform.shared.storage, trainyard.storage),
        (trainyard_platform.shared.storage.base, trainyard.storage.base),
        (trainyard_platform.shared.storage.s3, trainyard.storage.s3),
        (trainyard_platform.shared.suggest, trainyard.suggest),
    ],
    ids=lambda module: module.__name__,
)
def test_every_name_the_platform_module_exports_is_the_clients(platform, client) -> None:
    # trainyard_platform.shared.storage also exports S3Store, which the client keeps in trainyard.storage.s3
    # (checked below): importing trainyard.storage must not need MinIO's client.
    names = [
        n
        for n in platform.__all__
        if not (platform is trainyard_platform.shared.storage and n == "S3Store")
    ]
    assert names
    for name in names:
        assert getattr(platform, name) is getattr(client, name), name


def test_the_control_protocol_is_whole_under_both_names() -> None:
    """Everything ``trainyard.control`` defines at its top level, ``trainyard_platform.shared.control`` names."""
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
    assert public == set(trainyard_platform.shared.control.__all__)


def test_the_shared_models_and_helpers_are_one_object() -> None:
    assert (
        trainyard_platform.shared.events.payloads.CheckpointRef is trainyard.control.CheckpointRef
    )
    assert trainyard_platform.shared.events.payloads.HyperValue is trainyard.control.HyperValue
    assert (
        trainyard_platform.shared.settings.StorageSettings
        is trainyard.storage.settings.StorageSettings
    )
    assert trainyard_platform.shared.storage.local.LocalStore is trainyard.storage.LocalStore
    assert trainyard_platform.shared.storage.S3Store is trainyard.storage.s3.S3Store
    assert trainyard_platform.shared.telemetry.inject is trainyard.tracing.inject
