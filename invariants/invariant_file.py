"""Invariant files: versioned JSON, validated on load, never eval'd or unpickled.

Format (version 1)::

    {"format": "trainwatch-invariants", "version": 1,
     "invariants": [{"id": "inv-…", "relation": "EventContain", "params": {...},
                     "precondition": null | {"negated": false, "any": [{"all": [clause, ...]}]},
                     "description": "…", "apis": ["torch.optim.Optimizer.step"],
                     "examples": {"positive": 120, "negative": 14}}]}

Loading takes text, bytes or an already-parsed object (file opening is the caller's
job) and raises `InvariantFileError` naming the source, the invariant index and the
field.  Keys the format does not define, and parameters of the wrong type, are
rejected rather than ignored: a misspelt key would otherwise deploy a rule that never
checks anything.  An ``id`` that does not match the content is rejected too: ids are
how violations are deduplicated, so a hand-edited rule must not keep its old id.
Text nested deeper than `MAX_NESTING` is refused before it is parsed (the parser, and
everything that later walks a rule, recurses once per level).
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any, Iterable

from .invariant_set import InvariantSet
from .model import Invariant
from .param_schema import params_error
from .precondition import validate_precondition
from .relations import TEMPLATES

FORMAT = "trainwatch-invariants"
VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
DEFAULT_RESOURCE = "default_invariants.json"
#: Deepest nesting of objects and lists accepted; a written rule nests about 8 levels.
MAX_NESTING = 64
DOCUMENT_KEYS = frozenset({"format", "version", "invariants"})
INVARIANT_KEYS = frozenset({"id", "relation", "params", "precondition", "description", "apis", "examples"})

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


class InvariantFileError(ValueError):
    def __init__(self, source: str, message: str, index: int | None = None, field: str | None = None) -> None:
        where = source
        if index is not None:
            where += f": invariant [{index}]"
        if field:
            where += f" field {field!r}"
        super().__init__(f"{where}: {message}")
        self.source, self.index, self.field = source, index, field


def dumps(invariants: Iterable[Invariant]) -> str:
    """Deterministic text: sorted by id, keys sorted, one invariant per line block."""
    body = {
        "format": FORMAT,
        "version": VERSION,
        "invariants": [inv.to_dict() for inv in sorted(invariants, key=lambda i: i.id)],
    }
    return json.dumps(body, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def nested_deeper_than(text: str, limit: int) -> bool:
    """Whether JSON text opens more than ``limit`` objects/lists inside each other
    (brackets inside strings do not count); a linear scan that never recurses."""
    depth = 0
    for match in _JSON_BRACKET.finditer(_JSON_STRING.sub('""', text)):
        if match.group() in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def parse_json(text: str | bytes, source: str) -> Any:
    """UTF-8 JSON text as Python values, every failure an `InvariantFileError`."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvariantFileError(source, f"not UTF-8 text (byte offset {exc.start})") from None
    if nested_deeper_than(text, MAX_NESTING):
        raise InvariantFileError(source, f"nested more than {MAX_NESTING} levels deep")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvariantFileError(source, f"not valid JSON ({exc})") from None


def loads(text: str | bytes | dict[str, Any], source: str = "<invariants>") -> list[Invariant]:
    data = parse_json(text, source) if isinstance(text, (str, bytes)) else text
    if not isinstance(data, dict):
        raise InvariantFileError(source, "top level must be a JSON object")
    for key in data:
        if key not in DOCUMENT_KEYS:
            raise InvariantFileError(source, f"unknown key (the format has: {', '.join(sorted(DOCUMENT_KEYS))})",
                                     field=str(key))
    if data.get("format") != FORMAT:
        raise InvariantFileError(source, f"'format' must be {FORMAT!r}", field="format")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        raise InvariantFileError(
            source, f"unsupported version {version!r} (this build reads {sorted(SUPPORTED_VERSIONS)})", field="version"
        )
    items = data.get("invariants")
    if not isinstance(items, list):
        raise InvariantFileError(source, "'invariants' must be a list", field="invariants")
    return [_load_one(item, source, index) for index, item in enumerate(items)]


def _load_one(item: Any, source: str, index: int) -> Invariant:
    def fail(field: str, message: str) -> InvariantFileError:
        return InvariantFileError(source, message, index=index, field=field)

    if not isinstance(item, dict):
        raise fail("", "must be an object")
    if "relation" not in item:  # before unknown keys: a misspelt "relation" is a missing one
        raise fail("relation", "missing field")
    for key in item:
        if key not in INVARIANT_KEYS:
            raise fail(str(key), f"unknown key (an invariant has: {', '.join(sorted(INVARIANT_KEYS))})")
    relation = item["relation"]
    if not isinstance(relation, str):
        raise fail("relation", "must be a string")
    if relation not in TEMPLATES:
        raise fail("relation", f"unknown relation {relation!r} (known: {', '.join(sorted(TEMPLATES))})")
    if "params" not in item:
        raise fail("params", "missing field")
    params = item["params"]
    if not isinstance(params, dict):
        raise fail("params", "must be an object")
    typed = params_error(relation, params)
    if typed is not None:
        raise fail(f"params.{typed[0]}", typed[1])
    bad = TEMPLATES[relation].validate_params(params)
    if bad is not None:
        raise fail(f"params.{bad}", f"missing or invalid for relation {relation}")
    precondition = item.get("precondition")
    try:
        validate_precondition(precondition, "precondition")
    except ValueError as exc:
        message = str(exc)
        path, _, reason = message.partition(": ")
        raise fail(path, reason) from None
    description = item.get("description", "")
    if not isinstance(description, str):
        raise fail("description", "must be a string")
    apis = item.get("apis", [])
    if not isinstance(apis, list) or not all(isinstance(a, str) for a in apis):
        raise fail("apis", "must be a list of strings")
    examples = item.get("examples", {}) or {}
    if not isinstance(examples, dict):
        raise fail("examples", "must be an object")
    counts = []
    for key in ("positive", "negative"):
        value = examples.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise fail(f"examples.{key}", "must be a non-negative integer")
        counts.append(value)
    inv = Invariant(relation, params, precondition, description or TEMPLATES[relation].describe(params),
                    list(apis) or TEMPLATES[relation].apis(params), counts[0], counts[1])
    given = item.get("id")
    if given is not None:
        if not isinstance(given, str):
            raise fail("id", "must be a string")
        if given != inv.id:
            raise fail("id", f"does not match the invariant's content (expected {inv.id})")
    return inv


def load_set(text: str | bytes | dict[str, Any], source: str = "<invariants>") -> InvariantSet:
    return InvariantSet(loads(text, source))


def default_text() -> str:
    """The shipped, curated set (package data)."""
    return resources.files("invariants").joinpath("data", DEFAULT_RESOURCE).read_text(encoding="utf-8")


def load_default_set() -> InvariantSet:
    return load_set(default_text(), f"invariants/data/{DEFAULT_RESOURCE}")
