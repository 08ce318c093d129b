"""The documentation site: the profile reference is the schema's, and the site builds strictly."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvpd.profile.reference import render
from kvpd.profile.schema import Profile

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "reference" / "profile.md"


def test_profile_reference_is_the_schemas(update_golden: bool) -> None:
    page = render(Profile.model_json_schema())
    if update_golden:
        REFERENCE.write_text(page)
    assert REFERENCE.read_text() == page, (
        "docs/reference/profile.md is stale: `kvpd schema --markdown > docs/reference/profile.md`"
        " (or pytest --update-golden)"
    )


def test_every_field_of_every_section_is_in_the_reference() -> None:
    schema = Profile.model_json_schema()
    page = REFERENCE.read_text()
    for name, model in [("Profile", schema), *schema.get("$defs", {}).items()]:
        for field in model.get("properties", {}):
            assert f"| `{field}` |" in page, f"{name}.{field} missing from the reference"


def test_the_site_builds_with_strict_link_checking(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        pytest.fail("mkdocs is missing from the dev environment (pip install -e '.[dev]')")
    r = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "reference" / "profile" / "index.html").exists()
    shutil.rmtree(tmp_path / "site")


def _first_yaml_block(path: Path) -> str:
    return path.read_text().split("```yaml\n", 1)[1].split("```", 1)[0]


def test_the_readmes_annotated_profile_is_the_guides() -> None:
    """The README's one annotated profile is the one "Writing a profile" explains: one text."""
    assert _first_yaml_block(REPO / "README.md") == _first_yaml_block(REPO / "docs" / "profiles.md")


def test_the_readme_stays_short_and_links_only_pages_that_exist() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250, "README.md: at most ~250 lines; move detail to docs/"
    links = [m.split(")", 1)[0] for m in text.split("](")[1:]]
    missing = [t for t in links if "://" not in t and not (REPO / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
