"""Every profile field is described, in the models and in `kvpd schema`'s JSON Schema."""

from __future__ import annotations

import typing

from pydantic import BaseModel

from kvpd.profile.field_docs import DOCS
from kvpd.profile.schema import Profile


def _models(t: object) -> list[type[BaseModel]]:
    out = [t] if isinstance(t, type) and issubclass(t, BaseModel) else []
    for arg in typing.get_args(t):
        out += _models(arg)
    return out


def _all_models() -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = []
    todo: list[type[BaseModel]] = [Profile]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.append(m)
        for f in m.model_fields.values():
            todo += _models(f.annotation)
    return seen


def test_every_field_has_a_description() -> None:
    missing = [
        f"{m.__name__}.{n}"
        for m in _all_models()
        for n, f in m.model_fields.items()
        if not (f.description or "").strip()
    ]
    assert missing == []


def test_the_json_schema_carries_every_description() -> None:
    schema = Profile.model_json_schema()
    bare = [
        f"{name}.{prop}"
        for name, d in [("Profile", schema), *schema.get("$defs", {}).items()]
        for prop, p in d.get("properties", {}).items()
        if not p.get("description")
    ]
    assert bare == []
    assert "tensor-parallel size" in schema["$defs"]["Group"]["properties"]["tp"]["description"]


def test_no_description_is_left_unused() -> None:
    names = {f"{m.__name__}.{n}" for m in _all_models() for n in m.model_fields}
    assert sorted(set(DOCS) - names) == []
