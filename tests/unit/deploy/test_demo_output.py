"""What the demo prints of a model's recorded environment: readable, nothing dropped silently."""

from __future__ import annotations

from trainyard_platform.deploy.local.__main__ import _environment, _hardware


def test_the_package_list_is_summarised_and_nulls_are_left_out() -> None:
    env = {
        "python": "CPython 3.11.2",
        "cuda": None,
        "packages": ["a==1", "b==2", "torch==2.13.0+cpu"],
        "packages_sha256": "09f6c89609bf3b7c4db009490a8417e4",
    }
    assert _environment(env) == {
        "python": "CPython 3.11.2",
        "packages": "3 pinned (sha256 09f6c89609bf…)",
    }
    assert _environment({"python": "CPython 3.11.2"}) == {"python": "CPython 3.11.2"}
    assert _environment("opaque") == "opaque"


def test_hardware_names_each_gpu_model_once() -> None:
    lineage = {
        "environment": {
            "gpu_names": ["virtual-cpu", "virtual-cpu"],
            "gpu_flavor": "cpu",
            "node_id": "n1",
        }
    }
    assert _hardware(lineage) == "2 x cpu (virtual-cpu) on node n1"
