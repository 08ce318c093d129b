"""The documentation site: the profile reference is the schema's, and the site builds strictly."""

from __future__ import annotations

import ast
import re
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


# --- the rules index: which rule names which profile field in its messages ----------------------

RULES_DIR = REPO / "kvpd" / "plan" / "rules"
RULES_PAGE = REPO / "docs" / "reference" / "rules.md"
# How a rule spells a path element it computes: a group's role, a host's name (after "hosts"),
# a list index, or another key.
_GROUP_VARS = ("role", "last", "have")
RULES_HEAD = """# Rules by field

Generated from the rules' source (`kvpd/plan/rules/`) by `pytest tests/unit/test_docs.py
--update-golden`; do not edit by hand. Each profile field a rule names in its messages, with the
rule (module and function) that checks it: what the schema cannot see alone (combinations of
fields, the hardware, the guides' constraints). The schema's own checks per field (type, bounds,
patterns) are in [the profile reference](profile.md); what the rules refuse, in words, in
[writing a profile](../profiles.md#what-the-rules-refuse). `<group>` is `prefill`, `decode` or
`mixed`; `<host>` a host's name; `<key>` a field or key the rule picks, `<index>` a list
position. Rules that compute a field's whole path at run time (a KV service's section, a
scenario) are not listed here.

| field | checked by |
|---|---|
"""


def _path_element(e: ast.expr, before: str | None) -> str | None:
    if isinstance(e, ast.Constant) and isinstance(e.value, str):
        return e.value
    if isinstance(e, ast.Name):
        if e.id in _GROUP_VARS:
            return "<group>"
        return "<host>" if before == "hosts" else "<index>" if e.id == "i" else "<key>"
    return None  # computed (a starred prefix, a conditional): the path is not known statically


def _spelled(arg: ast.expr) -> str | None:
    """The dotted path of a tuple the rule spells out, or None."""
    if not isinstance(arg, ast.Tuple) or not arg.elts:
        return None
    parts: list[str | None] = []
    for e in arg.elts:
        parts.append(_path_element(e, parts[-1] if parts else None))
    return None if None in parts else ".".join(p for p in parts if p)


def _named_paths(fn: ast.FunctionDef) -> set[str]:
    """The field paths `fn` passes to `.err(...)`/`.warn(...)` as tuples it spells out."""
    paths = set()
    for call in ast.walk(fn):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            continue
        if call.func.attr not in ("err", "warn") or not call.args:
            continue
        if (path := _spelled(call.args[0])) is not None:
            paths.add(path)
    return paths


def render_rules_index() -> str:
    by_field: dict[str, set[str]] = {}
    for f in sorted(RULES_DIR.glob("*.py")):
        for fn in ast.walk(ast.parse(f.read_text())):
            if isinstance(fn, ast.FunctionDef):
                for path in _named_paths(fn):
                    by_field.setdefault(path, set()).add(f"`{f.stem}.{fn.name}`")
    rows = [f"| `{p}` | {', '.join(sorted(r))} |" for p, r in sorted(by_field.items())]
    return RULES_HEAD + "\n".join(rows) + "\n"


def test_the_rules_index_is_the_rules(update_golden: bool) -> None:
    page = render_rules_index()
    if update_golden:
        RULES_PAGE.write_text(page)
    assert RULES_PAGE.read_text() == page, (
        "docs/reference/rules.md is stale: pytest tests/unit/test_docs.py --update-golden"
    )


# --- troubleshooting quotes kvpd's own messages ---------------------------------------------------

TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"
# What the page writes in place of a message's values: these names, `...`, numbers, quoted
# values and dotted field names (the message's own words stay literal).
_STAND_INS = (
    "NAME|HOST|N|M|Ns|DIR|PROFILE|D|PORT|PATH|FILE|KEY|USER|BASTION|ADDRESS|PLATFORM|BACKEND|X|URL"
)
_VALUE = re.compile(rf"\.\.\.|\b(?:{_STAND_INS})\b|\S*\d\S*|'[^']*'|~|\b[a-z_]+\.[a-z_.]*[a-z_]\b")


def _source_strings() -> list[str]:
    """Every string literal of kvpd, an f-string's fields as NUL, backticks and line breaks
    dropped (messages are wrapped in the source and code-quoted in the page)."""
    out = []
    for f in sorted((REPO / "kvpd").rglob("*.py")):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.JoinedStr):
                out.append(
                    "".join(v.value if isinstance(v, ast.Constant) else "\0" for v in n.values)
                )
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                out.append(n.value)
    return [" ".join(s.replace("`", "").split()) for s in out]


def _literal_pieces(message: str) -> list[str]:
    pieces = []
    for chunk in _VALUE.split(message):
        for piece in re.split(r": |\(|\)", chunk):
            piece = " ".join(piece.split()).strip(" .,;")
            if len(piece) >= 10:
                pieces.append(piece)
    return pieces


def test_troubleshooting_quotes_messages_kvpd_prints() -> None:
    """Each message the page indexes (a bold code span) has a literal piece of 10 or more
    characters that some string in kvpd/ carries: the page does not invent or keep stale ones."""
    sources = _source_strings()
    messages = re.findall(r"\*\*`([^`]+)`\*\*", TROUBLESHOOTING.read_text())
    assert len(messages) >= 40
    unknown = [m for m in messages if not any(p in s for p in _literal_pieces(m) for s in sources)]
    assert not unknown, f"troubleshooting.md quotes messages kvpd does not print: {unknown}"
