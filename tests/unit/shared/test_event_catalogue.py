"""docs/events.md lists every event type the code defines (the catalogue stays true)."""

from pathlib import Path

from trainyard_platform.shared.events import EVENT_TYPES

CATALOGUE = Path(__file__).parents[3] / "docs" / "events.md"


def test_every_event_type_is_documented() -> None:
    text = CATALOGUE.read_text()
    missing = [t for t in EVENT_TYPES if f"`{t}`" not in text]
    assert missing == []
