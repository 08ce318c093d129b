"""Every bundled profile plans, and its rendered files and plan.json match tests/golden/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpd.cli.plan_cmd import write_plan_dir
from kvpd.plan.build import load_plan
from kvpd.profile.load import bundled_names

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
BASE_DIR = "/srv/kvpd"  # fixed, so local-profile paths in the golden files are stable


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_seed_deployment_is_bundled() -> None:
    assert set(bundled_names()) >= {
        "local",
        "layerwise-sparse-1p1d",
        "ucm-centralized-2p2d",
        "ucm-mooncake-2p2d",
        "ucm-pd-mixed",
        "large-ep",
    }


@pytest.mark.parametrize("name", bundled_names())
def test_golden(name: str, tmp_path: Path, update_golden: bool) -> None:
    plan = load_plan(name, base_dir=BASE_DIR)
    write_plan_dir(plan, tmp_path)
    got = _tree(tmp_path)
    want_dir = GOLDEN / name
    if update_golden:
        import shutil

        shutil.rmtree(want_dir, ignore_errors=True)
        write_plan_dir(plan, want_dir)
        return
    assert want_dir.is_dir(), f"no golden files for {name}: run pytest --update-golden"
    want = _tree(want_dir)
    assert sorted(got) == sorted(want)
    for path in want:
        assert got[path] == want[path], f"{name}/{path} differs from the golden file"


@pytest.mark.parametrize("name", bundled_names())
def test_plan_roundtrips_through_json(name: str) -> None:
    from kvpd.plan.value import Plan

    plan = load_plan(name, base_dir=BASE_DIR)
    again = Plan.from_dict(json.loads(plan.to_json()))
    assert again == plan


def test_plan_is_deterministic() -> None:
    a = load_plan("large-ep", base_dir=BASE_DIR)
    b = load_plan("large-ep", base_dir=BASE_DIR)
    assert a == b
    assert a.profile_digest == b.profile_digest
