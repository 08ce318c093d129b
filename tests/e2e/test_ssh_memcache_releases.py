"""The guide's memcache configuration (`kv.memcache.version: "1.2"`, `log_level: error`) on the
real MetaService of the bed: mmc-meta.conf has no metrics_url, the MetaService prints no ready
line, and `up` and `status` know it is ready by its meta port while it lives. (The 1.3 path,
HTTP /health, is the layerwise rehearsal in test_ssh_rehearsal.py.)

The engines are kvpd's stand-in (`--rehearse-with standin`): what is checked is the MetaService's
readiness, which the stand-in leaves as it is; CPU vLLM engines here cost minutes and prove
nothing more (the CPU-vLLM layerwise rehearsal proves the KV path)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_ssh_rehearsal import rehearse
from tests.testbed import Testbed

pytestmark = pytest.mark.ssh


def test_guide_release_is_ready_by_its_meta_port(bed: Testbed, tmp_path: Path) -> None:
    hosts = {"p1": "h1", "d1": "h2"}
    for r in rehearse(tmp_path, bed, "layerwise-sparse-1p1d", hosts, [], engines="standin"):
        meta = next(p for p in r.plan["processes"] if p["name"] == "metaservice")
        assert meta["health"]["url"] == ""
        assert meta["health"]["ready_port"] == 5000
        conf = next(f["content"] for f in r.plan["files"] if f["path"].endswith("mmc-meta.conf"))
        assert "metrics_url" not in conf
        rows = json.loads(r.kvpd("status", "--json").stdout)
        row = next(p for p in rows["processes"] if p["name"] == "metaservice")
        assert row["healthy"] is True, row
        assert row["detail"] == "port 5000 listens", row
