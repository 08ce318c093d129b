"""The base of every profile model: unknown keys forbidden, frozen, strict types."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


class _Model(BaseModel):
    # strict: `tp: true` or `port: "80"` are refused, not coerced (no bool-as-int anywhere)
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, strict=True, allow_inf_nan=False
    )

    @field_validator("hardware", mode="before", check_fields=False)
    @classmethod
    def _hardware_as_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) else v  # `hardware: 950` is an int in YAML
