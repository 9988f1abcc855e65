"""docs/events.md lists every event type the code defines (the catalogue stays true)."""

from pathlib import Path

from trainyard_platform.shared.events import EVENT_TYPES

CATALOGUE = Path(__file__).parents[3] / "docs" / "events.md"


def test_every_event_type_is_documented() -> None:
    text = CATALOGUE.read_text()
    missing = [t for t in EVENT_TYPES if f"`{t}`" not in text]
    assert missing == []


def test_every_field_of_the_shared_payload_parts_is_documented() -> None:
    """The field lists of `JobSpec`, `CheckpointRef`, `Environment` and `MetricPoint` (each
    from "`Name` =" to the paragraph's end) name every field the models have. JobSpec's
    left out `cpus_per_gpu` and `memory_gib_per_gpu`, which billing prices."""
    import re

    from trainyard_platform.shared.events import payloads

    text = CATALOGUE.read_text()
    for name in ("JobSpec", "CheckpointRef", "Environment", "MetricPoint"):
        model = getattr(payloads, name)
        start = text.index(f"`{name}` =")
        paragraph = text[start : text.index("\n\n", start)]
        named = set(re.findall(r"\w+", paragraph))
        missing = sorted(set(model.model_fields) - named)
        assert missing == [], f"{name}: {missing}"
