"""`kvpd schema`: print the profile's JSON Schema for editors."""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer) -> None:
    @app.command("schema")
    def schema() -> None:
        """Print the JSON Schema of the cluster profile (for editor completion/validation)."""
        from kvpd.profile.schema import Profile

        print(json.dumps(Profile.model_json_schema(), indent=2))
