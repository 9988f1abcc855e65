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


def test_each_event_row_lists_its_payload_s_fields() -> None:
    """Each row of the catalogue's table names every field of its type's payload, and at
    its top level (what is inside ``{...}`` or ``(...)`` is about a field) no other."""
    import re

    rows = 0
    for line in CATALOGUE.read_text().splitlines():
        match = re.match(r"\| `(trainyard\.[a-z_.]+\.v\d+)` \|", line)
        if not match:
            continue
        rows += 1
        model = EVENT_TYPES[match.group(1)]
        cell = re.split(r"(?<!\\)\|", line)[5]
        listed = re.match(r"\s*`([^`]*)`", cell)
        assert listed is not None, match.group(1)
        top = re.sub(r"\{[^}]*\}|\([^)]*\)", "", listed.group(1))
        named = [re.sub(r"\W.*", "", part.strip()) for part in top.split(",")]
        assert sorted(model.model_fields) == sorted(filter(None, named)), match.group(1)
    assert rows == len(EVENT_TYPES)
