"""The parameters each relation takes in an invariant file, and their JSON types.

A relation reads its parameters through ``str(...)`` and dict lookups, so a wrongly
typed value (``"api": 5``, ``"arg": null``) or a misspelt key would otherwise load
and then silently never match anything: the rule is deployed and checks nothing.
Loading therefore rejects any key a relation does not take and any value of the
wrong type, naming the field.  Which keys are *required* (they depend on a
relation's ``form``/``scope``) stays with each relation's own `validate_params`.
"""

from __future__ import annotations

from typing import Any, Mapping

#: A JSON value of any type (a constant an output is compared with).
ANY = object()
NAME = str  # a non-empty string: an API, argument, attribute or snapshot point name

PARAMS: dict[str, dict[str, Any]] = {
    "APIAbsent": {"api": NAME, "stage": NAME, "after_step": int},
    "APIArg": {"form": NAME, "api": NAME, "arg": NAME},
    "APIOutput": {"form": NAME, "api": NAME, "mtype": NAME, "arg": NAME, "prop": NAME, "out": NAME, "value": ANY},
    "APISequence": {"first": NAME, "then": NAME},
    "AllRanksReport": {},
    "InitSparesLearned": {"api": NAME},
    "LossArguments": {"form": NAME, "api": NAME, "arg": NAME, "other": NAME},
    "ModuleRegistration": {"api": NAME},
    "ApiContract": {"contract": NAME, "api": NAME},
    "Consistent": {"scope": NAME, "at": NAME, "attr": NAME, "a": NAME, "b": NAME},
    "EventContain": {"form": NAME, "api": NAME, "mtype": NAME, "attr": NAME, "effect": NAME, "child": NAME,
                     "args": dict},
    "StableVariables": {"at": NAME},
    "StablePrecision": {"api": NAME, "prop": NAME},
    "TrainingFlag": {"api": NAME, "mtype": NAME, "stage": NAME, "training": bool, "first_forward": bool,
                     "spectral_norm": NAME, "grad": bool},
}

_TYPE_WORDS = {str: "a non-empty string", int: "an integer", bool: "true or false", dict: "an object"}


def params_error(relation: str, params: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(key, message)`` for the first key of ``params`` that ``relation`` does not
    take or whose value has the wrong type; None when every key is well typed."""
    schema = PARAMS[relation]
    for key, value in params.items():
        expected = schema.get(key)
        if expected is None:
            known = ", ".join(sorted(schema)) or "none"
            return key, f"unknown parameter for relation {relation} (it takes: {known})"
        if expected is ANY:
            continue
        if expected is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif expected is str:
            ok = isinstance(value, str) and bool(value)
        else:
            ok = isinstance(value, expected)
        if not ok:
            return key, f"must be {_TYPE_WORDS[expected]}, got {_json_type(value)}"
    return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    return {int: "an integer", float: "a number", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)
