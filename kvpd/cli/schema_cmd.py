"""`kvpd schema`: print the profile's JSON Schema for editors."""

from __future__ import annotations

import json

import typer


def schema(
    markdown: bool = typer.Option(
        False, "--markdown", help="Print the profile reference (docs/reference/profile.md)."
    ),
) -> None:
    """Print the JSON Schema of the cluster profile (for editor completion/validation)."""
    from kvpd.profile.reference import render
    from kvpd.profile.schema import Profile

    doc = Profile.model_json_schema()
    print(render(doc) if markdown else json.dumps(doc, indent=2), end="" if markdown else "\n")


def register(app: typer.Typer) -> None:
    app.command("schema")(schema)
