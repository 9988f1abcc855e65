"""Job spec files: YAML or JSON, checked against the published JSON Schema before they go out.

Contract:
- ``load(path)`` reads a ``.yaml``/``.yml`` file as YAML and a ``.json`` file as JSON (any
  other name: JSON when it starts with ``{``, else YAML) and returns a ``SpecFile``: the spec
  as ``POST /v1/jobs`` takes it, and where each field stands in the file.
- YAML is read as YAML 1.2's core schema reads it, not PyYAML's 1.1 defaults: ``1e-3`` is a
  number, ``yes``/``no``/``on``/``off`` and dates are strings. A key given twice is an error
  (in JSON too), and so is any tag but the standard ones.
- ``apiVersion: trainyard.dev/v1`` and ``kind: Job`` name the format. A file without them is
  still read as that format (files written before they existed keep working), and ``load``
  says so through ``warn``; other values are errors. Like ``kubectl``, the client sends the
  spec without them (the endpoint says what it takes).
- The spec is checked against ``client/trainyard/schemas/job.v1.json`` (generated from the
  submission API's models); every problem is reported at once, each as
  ``FILE:LINE:COLUMN: FIELD: MESSAGE``. An unknown field names the closest known one
  ("did you mean 'hyperparameters'?"). The API checks the finer rules (entrypoint paths,
  requirements, known flavors); ``SpecFile.explain`` puts its 422 answer on the file's lines.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import IO, Any

import jsonschema
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.reader import ReaderError

from trainyard.patterns import pattern_message
from trainyard.secret_names import looks_secret
from trainyard.suggest import NOT_JOB_FIELDS, unknown_field

API_VERSION = "trainyard.dev/v1"
KIND = "Job"
SCHEMA_FILE = "job.v1.json"
MAX_VALUES = 200_000
"""The most values a spec file may hold once YAML's aliases are expanded (a spec has a few
thousand at most; an alias bomb has billions)."""
MAX_DEPTH = 32
MAX_SPEC_BYTES = 1 << 20
"""A spec file is read up to this (1 MiB; a spec file of a person's is a few KiB): a bigger
one, or a device that never ends, is refused, not read into memory whole."""
"""The deepest a spec file's values may nest (deeper is refused, however it is written)."""

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class SpecIssue:
    """One problem of a spec file: the field (``args[2]``, ``hyperparameters.lr``; empty for
    the file as a whole) and where it stands (1-based; None where unknown)."""

    field: str
    message: str
    line: int | None = None
    column: int | None = None

    def render(self, file: str) -> str:
        where = file if self.line is None else f"{file}:{self.line}:{self.column}"
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )


class SpecError(Exception):
    """A spec file that cannot be sent; ``str()`` is one line per issue."""

    def __init__(self, file: str, issues: Sequence[SpecIssue]) -> None:
        self.file = file
        self.issues = list(issues)
        super().__init__("\n".join(i.render(file) for i in self.issues))


@dataclass
class SpecFile:
    """A spec read from ``file``: ``spec`` to send, and the position of each field."""

    file: str
    spec: dict[str, Any]
    values: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path_, tuple[int, int]] = field(default_factory=dict)

    def locate(self, field_path: str) -> tuple[int, int] | None:
        """Where the API's field path (``args[2]``, ``hyperparameters.lr``) stands."""
        path = None if field_path == "body" else _parse_field(field_path, self.spec)
        while path is not None:
            if path in self.values:
                return self.values[path]
            if not path:
                return None
            path = path[:-1]
        return None

    def issue(self, field_path: str, message: str, *, key: bool = False) -> SpecIssue:
        path = _parse_field(field_path, self.spec)
        at = self.keys.get(path) if key and path is not None else None
        at = at or self.locate(field_path)
        return SpecIssue(field_path, message, *(at or (None, None)))

    def explain(self, errors: Sequence[dict[str, str]]) -> SpecError:
        """The API's field errors (a 422's ``errors``) on this file's lines."""
        issues = []
        for error in errors:
            name, message = error.get("field", ""), error.get("message", "")
            issues.append(self.issue(name, message, key=message.startswith("unknown field")))
        return SpecError(self.file, issues)


@cache
def schema_text() -> str:
    """The published JSON Schema of a job spec (``trainyard schema`` prints it)."""
    return resources.files("trainyard").joinpath("schemas", SCHEMA_FILE).read_text("utf-8")


def schema() -> dict[str, Any]:
    value: dict[str, Any] = json.loads(schema_text())
    return value


def load(path: Path, warn: Callable[[str], None] = lambda _: None) -> SpecFile:
    """Read and check the spec file at ``path`` (``SpecError`` naming every problem)."""
    file = str(path)
    try:
        with path.open("rb") as stream:
            return parse(_read_bounded(stream, file), file, warn)
    except OSError as exc:
        raise SpecError(file, [SpecIssue("", f"cannot read: {exc.strerror or exc}")]) from None


def load_stream(
    stream: IO[Any], file: str, warn: Callable[[str], None] = lambda _: None
) -> SpecFile:
    """``load`` of a spec read from ``stream``, of bytes or text (standard input, named
    ``file``)."""
    return parse(_read_bounded(stream, file), file, warn)


def _read_bounded(stream: IO[Any], file: str) -> str:
    """At most ``MAX_SPEC_BYTES`` of ``stream`` as UTF-8 text (``SpecError`` otherwise)."""
    data = stream.read(MAX_SPEC_BYTES + 1)
    if len(data) > MAX_SPEC_BYTES:
        too_big = f"is over {MAX_SPEC_BYTES} bytes: a job spec is a few KiB (data and code "
        raise SpecError(file, [SpecIssue("", too_big + "go in datasets and the code folder)")])
    if isinstance(data, str):
        return data
    try:
        return str(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise SpecError(file, [SpecIssue("", "is not UTF-8 text")]) from None


def parse(text: str, file: str, warn: Callable[[str], None] = lambda _: None) -> SpecFile:
    """Check the spec ``text`` of ``file`` (its name picks JSON or YAML)."""
    as_json = file.endswith(".json") or (
        not file.endswith((".yaml", ".yml")) and text.lstrip().startswith("{")
    )
    try:
        spec = _read_json(text, file) if as_json else _read_yaml(text, file)
    except RecursionError:  # the parsers recurse per level, before _node_value's bound
        deep = SpecIssue("", f"nested too deeply: at most {MAX_DEPTH} levels")
        raise SpecError(file, [deep]) from None
    if not isinstance(spec.spec, dict):
        raise SpecError(file, [SpecIssue("", "must hold one mapping (the job spec)", 1, 1)])
    issues = list(_schema_issues(spec))
    if issues:
        raise SpecError(file, sorted(issues, key=lambda i: (i.line or 0, i.column or 0)))
    for issue in _secret_looking(spec):
        warn(issue.render(file))
    if "apiVersion" not in spec.spec or "kind" not in spec.spec:
        warn(
            f"{file}: no apiVersion/kind; read as apiVersion: {API_VERSION}, kind: {KIND} "
            "(add both to the file)"
        )
    spec.spec = {k: v for k, v in spec.spec.items() if k not in ("apiVersion", "kind")}
    return spec


EMPTY = "is empty; a job spec is a mapping"
"""What an empty file is told, YAML or JSON."""


SECRET_WARNING = (
    "looks like a secret: a spec is stored with the job and readable by your team "
    "(describe --json, the dashboard); give the job no credentials in its spec"
)


def _secret_looking(spec: SpecFile) -> list[SpecIssue]:
    """The spec's names and values that look like credentials (``trainyard.secret_names``):
    keys of ``hyperparameters`` (at any depth) and ``labels``, and in ``args``/``command``
    the value of a ``--name=value``, ``NAME=value`` or ``--name value`` whose name does."""
    found: list[SpecIssue] = []

    def keys(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if looks_secret(str(key)):
                    found.append(spec.issue(f"{path}.{key}", SECRET_WARNING, key=True))
                keys(inner, f"{path}.{key}")

    keys(spec.spec.get("hyperparameters"), "hyperparameters")
    keys(spec.spec.get("labels"), "labels")
    for name in ("args", "command"):
        argv = spec.spec.get(name)
        if not isinstance(argv, list):
            continue
        for i, item in enumerate(argv):
            flag, given, _ = str(item).partition("=")
            after = str(argv[i - 1]) if i else ""
            if (given and looks_secret(flag.lstrip("-"))) or (
                after.startswith("-") and "=" not in after and looks_secret(after.lstrip("-"))
            ):
                found.append(spec.issue(f"{name}[{i}]", SECRET_WARNING))
    return found


# --- reading ----------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no type hints
    """PyYAML's safe loader with YAML 1.2's core schema for plain scalars."""


_Loader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in (
    ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    (
        "float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        list("-+0123456789."),
    ),
):
    _Loader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(_pattern), _first)

_SCALAR_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float", "str")}
_RESOLVER = _Loader("")
"""Resolves a plain scalar's tag by the rules above (``plain_scalar``)."""


def _read_yaml(text: str, file: str) -> SpecFile:
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "malformed"
        if "'\\t'" in problem:  # PyYAML's words leave the fix unsaid
            problem += " (YAML indents with spaces, never tabs)"
        line = None if mark is None else mark.line + 1
        near = "" if line is None else _key_near(text, line)
        issue = SpecIssue(
            near, f"invalid YAML: {problem}", line, None if mark is None else mark.column + 1
        )
        raise SpecError(file, [issue]) from None
    except ReaderError as exc:
        raise SpecError(file, [_reader_issue(text, exc)]) from None
    except yaml.YAMLError as exc:
        raise SpecError(file, [SpecIssue("", f"invalid YAML: {exc}")]) from None
    if root is None:
        raise SpecError(file, [SpecIssue("", EMPTY)]) from None
    spec = SpecFile(file, {})
    issues: list[SpecIssue] = []
    spec.spec = _node_value(root, (), spec, issues)
    if issues:
        raise SpecError(file, issues)
    return spec


def _node_value(node: Node, path: Path_, spec: SpecFile, issues: list[SpecIssue]) -> Any:
    if len(spec.values) >= MAX_VALUES or len(path) > MAX_DEPTH:
        message = f"too large: at most {MAX_VALUES} values, {MAX_DEPTH} deep"
        raise SpecError(spec.file, [SpecIssue(_field(path), message)])
    spec.values[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            at = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if not isinstance(key_node, ScalarNode):
                issues.append(SpecIssue(_field(path), "a key must be a plain name", *at))
                continue
            key = str(key_node.value)
            if key in out:
                issues.append(SpecIssue(_field((*path, key)), "given twice", *at))
            spec.keys[(*path, key)] = at
            out[key] = _node_value(value_node, (*path, key), spec, issues)
        return out
    if isinstance(node, SequenceNode):
        return [_node_value(item, (*path, i), spec, issues) for i, item in enumerate(node.value)]
    assert isinstance(node, ScalarNode)
    if node.tag not in _SCALAR_TAGS:
        at = spec.values[path]
        issues.append(SpecIssue(_field(path), f"unsupported YAML tag {node.tag}", *at))
        return None
    return _scalar(node.tag.rsplit(":", 1)[1], node.value)


def plain_scalar(text: str) -> Any:
    """``text`` as a spec file reads a plain scalar (YAML 1.2's core schema): an int, a
    float (``.inf`` and ``.nan`` included), a bool, None, or else ``text`` itself."""
    tag = _RESOLVER.resolve(ScalarNode, text, (True, False))
    return _scalar(tag.rsplit(":", 1)[1], text) if tag in _SCALAR_TAGS else text


def _scalar(kind: str, text: str) -> Any:
    if kind == "null":
        return None
    if kind == "bool":
        return text.lower() == "true"
    if kind == "int":
        return _integer(text)
    if kind == "float":
        plain = text.lower().lstrip("+")
        if plain in (".inf", "-.inf", ".nan"):
            return float(plain.replace(".", ""))
        return float(text)
    return text


def _integer(text: str) -> int | float:
    """``text``, an integer of YAML (``0x``/``0o`` too) or JSON, as an int; one of more
    digits than Python converts (``sys.get_int_max_str_digits``, 4300) as the infinity of its
    sign, which every check then refuses as no finite number (``seed: must be an integer``,
    ``--set``'s usage error). ``int()`` raised ValueError, which the CLI said as "unexpected
    ValueError", naming neither the file nor the field. So is a ``0x``/``0o`` one whose
    value has more decimal digits than that: ``int()`` reads it in any length, but the
    schema check's message (``... is greater than the maximum``) writes it in decimal, and
    raised the same ValueError. (YAML gives neither a sign.)"""
    try:
        value = int(text, 0) if text.startswith(("0o", "0x")) else int(text)
        str(value)  # raises, at once, where a message could not write it
    except ValueError:
        return -math.inf if text.startswith("-") else math.inf
    return value


def _reader_issue(text: str, exc: ReaderError) -> SpecIssue:
    """PyYAML's refusal of a character no YAML holds (a control character such as NUL, a
    lone surrogate) at its line and column, named by its code point: PyYAML's own words
    name the file ``"<unicode string>"`` and count the position from its start, on a
    second line."""
    at = min(exc.position, len(text))
    line = text.count("\n", 0, at) + 1
    code = ord(exc.character) if isinstance(exc.character, str) else exc.character
    return SpecIssue(
        _key_near(text, line),
        f"invalid YAML: character U+{code:04X} is not allowed (YAML holds no control "
        "characters but tab and line breaks)",
        line,
        at - text.rfind("\n", 0, at),
    )


def _key_near(text: str, line: int) -> str:
    """The key on or above ``line`` (1-based): what a syntax error is most likely in."""
    lines = text.splitlines()
    for number in range(min(line, len(lines)), 0, -1):
        match = re.match(r"\s*-?\s*\"?([A-Za-z_][\w.-]*)\"?\s*:", lines[number - 1])
        if match:
            return match.group(1)
    return ""


_JSON_KEY = re.compile(r'"([A-Za-z_][\w.-]*)"\s*:')


def _json_issue(text: str, exc: json.JSONDecodeError) -> SpecIssue:
    """``exc`` at the key before it; a trailing comma (JavaScript and Python allow one, so
    people write it) named as such, at the comma, since the parser's words do not say."""
    at, message = exc.pos, exc.msg
    before = text[: exc.pos].rstrip()
    closing = text[exc.pos : exc.pos + 1]
    if before.endswith(",") and closing in ("}", "]"):
        at = len(before) - 1
        message = f"a trailing comma before '{closing}' (JSON allows none): remove it"
    line = text.count("\n", 0, at) + 1
    column = at - text.rfind("\n", 0, at)
    keys = _JSON_KEY.findall(text, 0, at)
    return SpecIssue(keys[-1] if keys else "", f"invalid JSON: {message}", line, column)


def _read_json(text: str, file: str) -> SpecFile:
    duplicates: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                duplicates.append(key)
            seen[key] = value
        return seen

    if not text.strip():
        raise SpecError(file, [SpecIssue("", EMPTY)])
    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_int=_integer)
    except json.JSONDecodeError as exc:
        raise SpecError(file, [_json_issue(text, exc)]) from None
    spec = SpecFile(file, value)
    try:  # positions only: JSON is YAML, and YAML's parser knows where each node is
        root = yaml.compose(text, Loader=_Loader)
        if root is not None:
            _node_value(root, (), SpecFile(file, {}, spec.values, spec.keys), [])
    except yaml.YAMLError:
        pass
    if duplicates:
        raise SpecError(file, [spec.issue(key, "given twice", key=True) for key in duplicates])
    return spec


# --- checking ---------------------------------------------------------------------------------


@cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


def _schema_issues(spec: SpecFile) -> Iterator[SpecIssue]:
    """Every problem of the spec's values, one per value where one says it: a value of the
    wrong type is told its type alone (``seed: 1e400`` is ``must be an integer``, not also
    ``must be at most 4294967295`` and ``must be a finite number``); a value not of its form
    is told the form, whose words say its length too (``name`` of 101 letters: not also
    ``must be at most 100 characters``)."""
    leaves = [leaf for error in _validator().iter_errors(spec.spec) for leaf in _leaves(error)]
    mistyped = {tuple(leaf.absolute_path) for leaf in leaves if leaf.validator == "type"}
    worded = {
        tuple(leaf.absolute_path)
        for leaf in leaves
        if leaf.validator == "pattern" and pattern_message(leaf.validator_value)
    }
    for leaf in leaves:
        path = tuple(leaf.absolute_path)
        if leaf.validator in ("minLength", "maxLength") and path in worded:
            continue
        if leaf.validator == "type" or path not in mistyped:
            yield from _issues(leaf, spec)
    for path in _not_finite(spec.spec):
        if not any(path[:depth] in mistyped for depth in range(len(path) + 1)):
            yield spec.issue(_field(path), "must be a finite number")


def _leaves(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """The errors of the one branch of an ``anyOf``/``oneOf`` the value was meant for (not
    ``null``, the ``kind`` it names), or the error itself when that is unclear."""
    if error.validator not in ("anyOf", "oneOf") or not error.context:
        return [error]
    branches: dict[Any, list[jsonschema.ValidationError]] = {}
    for sub in error.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    meant = [errs for errs in branches.values() if not any(_wrong_branch(e) for e in errs)]
    if len(meant) == 1:
        return [leaf for sub in meant[0] for leaf in _leaves(sub)]
    return [error]


def _wrong_branch(error: jsonschema.ValidationError) -> bool:
    return (error.validator == "type" and not error.relative_path) or (
        error.validator == "const" and list(error.relative_path) == ["kind"]
    )


_TYPES = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


def _issues(error: jsonschema.ValidationError, spec: SpecFile) -> Iterator[SpecIssue]:
    path: Path_ = tuple(error.absolute_path)
    name = _field(path)
    kind, value = error.validator, error.validator_value
    if kind == "additionalProperties" and value is False:
        known = list(error.schema.get("properties", {}))
        for key in error.instance:
            if key not in known:
                absent = NOT_JOB_FIELDS if not path else None
                yield spec.issue(_field((*path, key)), unknown_field(key, known, absent), key=True)
        return
    if kind == "required":
        missing = re.match(r"'([^']+)'", error.message)
        where = spec.values.get(path, (None, None))
        yield SpecIssue(
            _field((*path, missing.group(1) if missing else "?")), "field required", *where
        )
        return
    tagged = error.schema.get("discriminator") if isinstance(error.schema, dict) else None
    if kind in ("anyOf", "oneOf") and isinstance(tagged, dict) and isinstance(error.instance, dict):
        # No form fits a mapping whose tag names none (``code`` without a ``kind``): the tag is
        # the mistake, and the forms it may name say how to write it.
        tag = str(tagged.get("propertyName"))
        kinds = "one of " + ", ".join(repr(k) for k in tagged.get("mapping", {}))
        said = f"field required ({kinds})" if tag not in error.instance else f"must be {kinds}"
        yield spec.issue(_field((*path, tag)), said)
        return
    if "propertyNames" in error.schema_path:
        yield spec.issue(name, f"key {error.instance!r}: {_message(error)}")
        return
    yield spec.issue(name, _message(error))


def _message(error: jsonschema.ValidationError) -> str:
    kind, value = error.validator, error.validator_value
    messages: dict[Any, Callable[[], str]] = {
        "type": lambda: (
            "must be "
            + _or([_TYPES.get(t, t) for t in ([value] if isinstance(value, str) else value)])
            + _type_hint([value] if isinstance(value, str) else list(value), error.instance)
        ),
        "maximum": lambda: f"must be at most {value}",
        "minimum": lambda: f"must be at least {value}",
        "maxLength": lambda: f"must be at most {value} characters",
        "minLength": lambda: f"must be at least {value} character{'s' if value != 1 else ''}",
        "maxItems": lambda: f"must have at most {value} items",
        "minItems": lambda: f"must have at least {value} item{'s' if value != 1 else ''}",
        "maxProperties": lambda: f"must have at most {value} entries",
        "pattern": lambda: pattern_message(value) or f"must match {value}",
        "const": lambda: f"must be {value!r}",
        "enum": lambda: "must be one of " + ", ".join(repr(v) for v in value),
    }
    if kind in messages:
        return messages[kind]()
    if kind in ("anyOf", "oneOf"):
        if error.context and all(e.validator == "type" for e in error.context):
            return "must be " + _or(
                [_TYPES.get(str(e.validator_value), str(e.validator_value)) for e in error.context]
            )
        return "matches none of the allowed forms (see `trainyard schema`)"
    return str(error.message)


_YAML11_BOOLEANS = {"yes": True, "no": False, "on": True, "off": False, "y": True, "n": False}


def _type_hint(wanted: list[str], value: Any) -> str:
    """How to write ``value`` as the one type ``wanted``, where the fix is plain: quoting a
    number, unquoting one, a list for a scalar, ``true`` for YAML 1.1's ``yes``; else ""."""
    if len(wanted) != 1:
        return ""
    want = wanted[0]
    if want == "array" and not isinstance(value, dict | list):
        return " (in YAML: [a, b], or one '- a' per line)"
    if want == "string" and isinstance(value, bool | int | float):
        return f' (quote it: "{json.dumps(value)}")'
    if want == "boolean" and isinstance(value, str) and value.lower() in _YAML11_BOOLEANS:
        meant = "true" if _YAML11_BOOLEANS[value.lower()] else "false"
        return f" (YAML 1.2 reads {value!r} as a string: write {meant})"
    if want in ("integer", "number") and isinstance(value, str):
        number = plain_scalar(value.strip())
        fits = int if want == "integer" else int | float
        if isinstance(number, fits) and not isinstance(number, bool):
            return f" (remove the quotes: {value.strip()})"
    return ""


def _or(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _field(path: Path_) -> str:
    """``("args", 2)`` -> ``args[2]``, as the API names fields."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _parse_field(name: str, data: Any) -> Path_ | None:
    """The path the API's field name stands for in ``data`` (keys may hold dots)."""
    path: list[str | int] = []
    rest = name
    while rest:
        index = re.match(r"\[(\d+)\]\.?", rest)
        if index and isinstance(data, list):
            position = int(index.group(1))
            path.append(position)
            data = data[position] if position < len(data) else None
            rest = rest[index.end() :]
            continue
        if not isinstance(data, dict):
            return tuple(path)
        key = next(
            (
                k
                for k in sorted(data, key=len, reverse=True)
                if rest == k or rest.startswith((f"{k}.", f"{k}["))
            ),
            None,
        )
        if key is None:
            head = re.match(r"[^.\[]*", rest)
            return (*path, head.group(0) if head else rest)
        path.append(key)
        data = data[key]
        rest = rest[len(key) :].removeprefix(".")
    return tuple(path)


def _not_finite(value: Any, path: Path_ = ()) -> Iterator[Path_]:
    """The paths of NaN and infinities in ``value`` (JSON holds none)."""
    if isinstance(value, float) and not math.isfinite(value):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _not_finite(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _not_finite(item, (*path, index))
