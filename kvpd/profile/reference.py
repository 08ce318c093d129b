"""The profile reference (docs/reference/profile.md), rendered from the profile's JSON Schema.

Pure: schema in, Markdown out. Every field of every section with its type, default, the
constraints the schema checks and its description, so the page cannot drift from the schema
(a test compares the committed page with this rendering; `kvpd schema --markdown` prints it).
Rules that look at several fields at once live in kvpd/plan/rules and are named in the field
descriptions where they apply.
"""

from __future__ import annotations

import json
from typing import Any

HEADER = """# Profile reference

Generated from the profile schema by `kvpd schema --markdown`; do not edit by hand. Every
field of a cluster profile, section by section: its type, its default (none: required, or
derived by kvpd when it says so), what the schema checks, and what it means. A profile is YAML;
`kvpd schema` prints the same schema as JSON Schema for editors.
"""

_CONSTRAINTS = (
    ("minimum", ">= {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "<= {}"),
    ("exclusiveMaximum", "< {}"),
    ("minLength", "at least {} characters"),
    ("maxLength", "at most {} characters"),
    ("minItems", "at least {} items"),
    ("maxItems", "at most {} items"),
    ("minProperties", "at least {} entries"),
    ("pattern", "matches `{}`"),
)


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def type_of(node: dict[str, Any]) -> str:
    """A short type: `int`, `string`, `list of Host`, `map of name -> Host`, `a | b`, ..."""
    if "$ref" in node:
        return f"[{_ref_name(node['$ref'])}](#{_ref_name(node['$ref']).lower()})"
    if "enum" in node:
        return " | ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    for key in ("anyOf", "oneOf"):
        if key in node:
            parts = [type_of(n) for n in node[key] if n.get("type") != "null"]
            nullable = any(n.get("type") == "null" for n in node[key])
            return " | ".join(dict.fromkeys(parts)) + (" (or null)" if nullable else "")
    kind = node.get("type")
    if kind == "array":
        return f"list of {type_of(node.get('items', {}))}"
    if kind == "object":
        inner = node.get("additionalProperties") or next(
            iter(node.get("patternProperties", {}).values()), None
        )
        return f"map of name -> {type_of(inner)}" if isinstance(inner, dict) else "object"
    return {"integer": "int", "number": "number", "boolean": "bool"}.get(str(kind), str(kind))


def constraints(node: dict[str, Any]) -> str:
    found = [fmt.format(node[key]) for key, fmt in _CONSTRAINTS if key in node]
    for key in ("anyOf", "oneOf"):
        for n in node.get(key, []):
            found += [fmt.format(n[k]) for k, fmt in _CONSTRAINTS if k in n]
    return "; ".join(dict.fromkeys(found))


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _default(name: str, node: dict[str, Any], required: set[str]) -> str:
    if "default" in node:
        return f"`{json.dumps(node['default'])}`"
    return "required" if name in required else "-"


def section(title: str, model: dict[str, Any]) -> list[str]:
    """One model's fields as a table."""
    lines = [f"## {title}", ""]
    if model.get("description"):
        lines += [_cell(model["description"]), ""]
    required = set(model.get("required", []))
    lines += ["| field | type | default | checked | description |", "|---|---|---|---|---|"]
    for name, node in model.get("properties", {}).items():
        row = (
            f"`{name}`",
            _cell(type_of(node)),
            _cell(_default(name, node, required)),
            _cell(constraints(node)),
            _cell(node.get("description", "")),
        )
        lines.append("| " + " | ".join(row) + " |")
    return lines + [""]


def render(schema: dict[str, Any]) -> str:
    """The whole page: the profile's top level, then every section in name order."""
    lines = [HEADER, *section("Profile", schema)]
    for name, model in sorted(schema.get("$defs", {}).items()):
        if model.get("type") == "object" and "properties" in model:
            lines += section(name, model)
    return "\n".join(lines).rstrip() + "\n"
