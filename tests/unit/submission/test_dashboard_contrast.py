"""Every text colour of the dashboard's stylesheet against every background it is drawn on
has WCAG AA's contrast (4.5:1 for text of ordinary size).

The stylesheet is read as it ships (``web/style.css``): a rule that gives both a text colour
and a background (a badge, a tag, a message, a button) is checked as that pair; a rule that
gives only a text colour is checked against every surface that holds text (the page, a card,
a highlighted table row, a message, a GPU tile, a tag), or, in the dark sidebar and log
panes, against theirs. The browser test (tests/browser/test_dashboard_presentation.py) reads
the same on the rendered pages.
"""

from __future__ import annotations

import re

import pytest

from trainyard_platform.services.submission.dashboard import WEB

AA = 4.5
CSS = re.sub(r"/\*.*?\*/", "", (WEB / "style.css").read_text(), flags=re.S)
RULES = [
    (" ".join(selector.split()), dict(re.findall(r"([\w-]+)\s*:\s*([^;]+?)\s*(?:;|$)", body)))
    for selector, body in re.findall(r"([^{}@]+)\{([^{}]*)\}", CSS)
]
VARIABLES = {k: v for selector, decls in RULES if selector == ":root" for k, v in decls.items()}

DARK = (".sidebar", "#nav", ".brand", ".who", "button.link", "pre.logs")
"""Selectors of the dark panes: their text is light on the sidebar's or the logs' dark."""
SURFACES = (
    ":root",
    ".card",
    "table.grid tbody tr:hover",
    "table.grid tr.selected",
    ".message.error",
    ".message.warn",
    ".message.info",
    ".gpu.free",
    ".gpu.lost",
    ".tag",
)
"""The rules whose background holds text that takes its colour from elsewhere."""
DARK_SURFACES = (".sidebar", "pre.logs")
LINEAGE_SHAPES = "svg.lineage"
"""The lineage graph's text is drawn (``fill``) on its nodes' boxes (their ``rect`` fill)."""


def rgb(value: str) -> tuple[float, float, float, float] | None:
    """A colour value as (r, g, b, alpha), ``var(--x)`` resolved; None for what is no solid
    colour (a gradient, ``inherit``, a colour computed from a property)."""
    value = value.strip()
    while match := re.fullmatch(r"var\((--[\w-]+)\)", value):
        value = VARIABLES[match.group(1)]
    if re.fullmatch(r"#[0-9a-fA-F]{3}", value):
        value = "#" + "".join(c * 2 for c in value[1:])
    if re.fullmatch(r"#[0-9a-fA-F]{6}", value):
        return (int(value[1:3], 16), int(value[3:5], 16), int(value[5:7], 16), 1.0)
    if match := re.fullmatch(r"rgba?\(([^)]*)\)", value):
        parts = [float(p) for p in re.split(r"[\s,/]+", match.group(1).strip())]
        return (parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else 1.0)
    if value == "#fff" or value == "white":
        return (255, 255, 255, 1.0)
    return None


def over(top: tuple[float, ...], under: tuple[float, ...]) -> tuple[float, float, float, float]:
    a = top[3]
    r, g, b = (top[i] * a + under[i] * (1 - a) for i in range(3))
    return (r, g, b, 1.0)


def luminance(colour: tuple[float, ...]) -> float:
    def channel(v: float) -> float:
        v /= 255
        return v / 12.92 if v <= 0.03928 else float(((v + 0.055) / 1.055) ** 2.4)

    r, g, b = (channel(v) for v in colour[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def ratio(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def background(decls: dict[str, str]) -> tuple[float, float, float, float] | None:
    return rgb(decls.get("background-color") or decls.get("background") or "")


def surface(selector: str) -> tuple[float, float, float, float]:
    found = [background(d) for s, d in RULES if s == selector and background(d)]
    assert found, f"the stylesheet has no background for {selector!r}: update this test"
    colour = found[-1]
    assert colour is not None
    return colour


def pairs() -> list[tuple[str, str, tuple[float, ...], tuple[float, ...]]]:
    """(text rule, background named, text colour, background colour) for every text colour."""
    page, dark = surface(".card"), surface(".sidebar")
    found = []
    for selector, decls in RULES:
        if selector.startswith(LINEAGE_SHAPES):
            ink = rgb(decls.get("fill", "")) if "text" in selector or "title" in selector else None
            if ink is not None:
                for shape, shape_decls in RULES:
                    fill = rgb(shape_decls.get("fill", ""))
                    if shape.startswith(LINEAGE_SHAPES) and shape.endswith("rect") and fill:
                        found.append((selector, shape, ink, fill))
            continue
        ink = rgb(decls.get("color", ""))
        if ink is None:
            continue
        in_dark = any(selector.startswith(d) for d in DARK)
        base = dark if in_dark else page
        own = background(decls)
        if own is not None:
            found.append(
                (selector, "its own background", over(ink, over(own, base)), over(own, base))
            )
            continue
        for name in DARK_SURFACES if in_dark else SURFACES:
            under = over(surface(name), base)
            found.append((selector, name, over(ink, under), under))
    return found


def test_every_text_colour_is_readable_on_every_background_it_is_drawn_on() -> None:
    checked = pairs()
    assert len(checked) > 50  # the parser found the stylesheet's rules
    failing = [
        f"{selector} on {name}: {ratio(ink, under):.2f}:1"
        for selector, name, ink, under in checked
        if ratio(ink, under) < AA
    ]
    assert not failing, "\n".join(failing)


def test_the_stylesheet_has_one_theme() -> None:
    """A dark theme would need its own pairs checked: this test says so when one appears."""
    assert "prefers-color-scheme" not in CSS


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [("#000000", "#ffffff", 21.0), ("#777777", "#ffffff", 4.48), ("#ffffff", "#ffffff", 1.0)],
)
def test_the_contrast_ratio_is_wcags(a: str, b: str, expected: float) -> None:
    colour_a, colour_b = rgb(a), rgb(b)
    assert colour_a is not None and colour_b is not None
    assert ratio(colour_a, colour_b) == pytest.approx(expected, abs=0.01)


def test_the_budget_marks_are_among_the_colours_checked() -> None:
    """The budgets page's marks (exhausted, near the limit, within) are text on their own
    backgrounds: the pairs above include them, so they are held to AA like the rest."""
    checked = {selector for selector, name, _, _ in pairs() if name == "its own background"}
    assert {".badge.budget-exhausted", ".badge.budget-near", ".badge.budget-ok"} <= checked
