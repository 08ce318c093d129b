"""Schema errors as sentences about the field: what is wrong and how to fix it.

Pydantic reports a union's failure once per member and names members in the location
(`request_rate.float`, `independent_layers.list[int]`); here locations are reduced to the
profile's own keys and one field gets one message.
"""

from __future__ import annotations

import difflib
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from kvpd.profile.container_schema import PATTERN_TEXT as CONTAINER_PATTERNS
from kvpd.profile.schema import Profile

Path_ = tuple[str | int, ...]

PATTERNS = {
    "^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$": "a name of letters, digits, '_', '.' and '-' that "
    "starts with a letter or digit (at most 63 characters; it becomes a folder name)",
    "^[A-Za-z0-9][A-Za-z0-9_.-]*$": "a name of letters, digits, '_', '.' and '-' that starts "
    "with a letter or digit (it becomes a folder name)",
    "^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14}$": "a network interface name such as eth0 "
    "(at most 15 characters)",
    "^[A-Za-z0-9_][A-Za-z0-9_.-]*$": "a login name of letters, digits, '_', '.' and '-'",
    "^[A-Za-z0-9_.:,@-]*$": "a device name of letters, digits and '_.:,@-'",
    **CONTAINER_PATTERNS,
}


def dotted(path: Path_) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = str(part)
            if not text.isprintable():
                text = repr(text)
            out += ("." if out else "") + text
    return out or "(top level)"


def _model_at(path: Path_) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at `path` (for "did you mean")."""
    model: Any = Profile
    parts = list(path)
    i = 0
    while i < len(parts):
        part = parts[i]
        i += 1
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        model = _unwrap(field.annotation)
        if get_origin(model) is dict:  # e.g. hosts: the next element is a key (a host name)
            args = get_args(model)
            model = _unwrap(args[1]) if len(args) == 2 else None
            i += 1
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    """Strip Optional/Union-with-None and list[...] to the interesting inner type."""
    while True:
        origin = get_origin(tp)
        if origin is list:
            tp = get_args(tp)[0]
            continue
        if origin is not None and type(None) in get_args(tp):
            rest = [a for a in get_args(tp) if a is not type(None)]
            if len(rest) == 1:
                tp = rest[0]
                continue
        return tp


def _message(err: dict[str, Any]) -> tuple[Path_, str]:
    loc: Path_ = tuple(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        model = _model_at(loc[:-1])
        allowed = sorted(model.model_fields) if model else []
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        listing = f" Allowed here: {', '.join(allowed)}." if allowed and not close else ""
        return loc, f"unknown field '{key}'.{hint}{listing}"
    if kind == "missing":
        return loc, "required field is missing. Add it."
    inp = err.get("input")
    shown = repr(inp) if not isinstance(inp, (dict, list)) else type(inp).__name__
    msg = err["msg"]
    if kind == "literal_error":
        return loc, f"{shown} is not allowed: {msg[0].lower() + msg[1:]}."
    return loc, f"{shown}: {msg[0].lower() + msg[1:]}."


def _clean_loc(loc: tuple[Any, ...], data: Any) -> Path_:
    """Keep the parts of a pydantic location that are keys of the profile (or field names)."""
    out: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            out.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            out.append(part)
            node = node[part]
        elif (
            isinstance(part, str)
            and (model := _model_at(tuple(out))) is not None
            and (part in model.model_fields)
        ):
            out.append(part)  # a missing field
            node = None
    return tuple(out)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "empty"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "...'"


# Error kinds whose phrase names one limit from the error's context: kind -> (phrase, ctx key).
_WITH_LIMIT = {
    "greater_than_equal": ("at least {}", "ge"),
    "greater_than": ("greater than {}", "gt"),
    "less_than_equal": ("at most {}", "le"),
    "less_than": ("less than {}", "lt"),
    "literal_error": ("one of {}", "expected"),
    "too_short": ("given with at least {} entry", "min_length"),
    "too_long": ("a list of at most {} entries", "max_length"),
}


def _expect(err: dict[str, Any]) -> str:
    """What the field must be, as the end of 'must be ...'."""
    kind = err["type"]
    ctx = err.get("ctx") or {}
    simple = {
        "int_type": "a whole number",
        "int_parsing": "a whole number",
        "int_from_float": "a whole number",
        "bool_type": "true or false",
        "float_type": "a number",
        "string_type": "text (quote it)",
        "dict_type": "a mapping of `key: value` lines",
        "model_type": "a mapping of `key: value` lines",
        "model_attributes_type": "a mapping of `key: value` lines",
        "list_type": "a list such as [a, b]",
        "finite_number": "a finite number",
        "none_required": "empty",
    }
    if kind in simple:
        return simple[kind]
    if kind in _WITH_LIMIT:
        phrase, key = _WITH_LIMIT[kind]
        return phrase.format(ctx.get(key))
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern", ""))
        return PATTERNS.get(pattern, f"text matching {pattern}")
    return str(err.get("msg", "valid")).lower()


def _one(loc: Path_, err: dict[str, Any]) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1]) if loc else "?"
        model = _model_at(loc[:-1])
        allowed = sorted(model.model_fields) if model else []
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        listing = f" Allowed here: {', '.join(allowed)}." if allowed and not close else ""
        fix = "" if close or allowed else " Remove it."
        return f"unknown field '{key}'.{hint}{listing}{fix}"
    if kind == "missing":
        return "required field is missing. Add it."
    if kind in ("value_error", "assertion_error"):
        msg = str((err.get("ctx") or {}).get("error") or err["msg"])
        return msg.rstrip(".") + "."
    return ""


def _fix(errs: list[dict[str, Any]], expects: list[str]) -> str:
    if all(e["type"] == "literal_error" for e in errs):
        return "Pick one of them."
    if all(e["type"] == "string_pattern_mismatch" for e in errs):
        return "Rename it accordingly."
    if all(e["type"] == "too_short" for e in errs):
        return "Add an entry."
    quotes = " (without quotes)" if _quoted_number(errs[0]) else ""
    return f"Set it to {expects[0]}{quotes}."


def _quoted_number(err: dict[str, Any]) -> bool:
    inp = err.get("input")
    return isinstance(inp, str) and inp.strip().lstrip("-").replace(".", "", 1).isdigit()


def schema_messages(e: ValidationError, data: Any) -> list[tuple[Path_, str]]:
    """One message per field, in the order pydantic found them."""
    by_loc: dict[Path_, list[dict[str, Any]]] = {}
    for err in e.errors():
        by_loc.setdefault(_clean_loc(tuple(err["loc"]), data), []).append(dict(err))
    out: list[tuple[Path_, str]] = []
    for loc, errs in by_loc.items():
        special = [m for m in (_one(loc, err) for err in errs) if m]
        if special:
            out.extend((loc, m) for m in dict.fromkeys(special))
            continue
        expects = list(dict.fromkeys(_expect(err) for err in errs))
        shown = _shown(errs[0].get("input"))
        field = str(loc[-1]) if loc and isinstance(loc[-1], str) else "this entry"
        out.append(
            (
                loc,
                f"{field} must be {' or '.join(expects)}, not {shown}. {_fix(errs, expects)}",
            )
        )
    return out
