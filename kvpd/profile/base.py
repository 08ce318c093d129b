"""The base of every profile model: unknown keys forbidden, frozen, strict types."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


class _Model(BaseModel):
    # strict: `tp: true` or `port: "80"` are refused, not coerced (no bool-as-int anywhere)
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, strict=True, allow_inf_nan=False
    )

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Fields without a description take theirs from `field_docs` (rebuilt once so the
        JSON Schema carries it too)."""
        super().__pydantic_init_subclass__(**kwargs)
        from kvpd.profile.field_docs import DOCS

        filled = False
        for name, info in cls.model_fields.items():
            if info.description:
                continue
            doc = next((DOCS[k] for k in _keys(cls, name) if k in DOCS), None)
            if doc is not None:
                info.description = doc
                filled = True
        if filled:
            cls.model_rebuild(force=True)

    @field_validator("hardware", mode="before", check_fields=False)
    @classmethod
    def _hardware_as_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) else v  # `hardware: 950` is an int in YAML


def _keys(cls: type, name: str) -> list[str]:
    return [f"{k.__name__}.{name}" for k in cls.__mro__]
