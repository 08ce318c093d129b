"""memcache-hybrid releases: `kv.memcache.version` decides what mmc-meta.conf carries and how
`up` knows the MetaService is ready (the guide's 1.2 and its `log_level = error`; 1.3)."""

from __future__ import annotations

from kvpd.plan.build import load_plan
from kvpd.plan.value import Plan


def _meta(plan: Plan) -> str:
    return next(f.content for f in plan.files if f.path.endswith("mmc-meta.conf"))


def test_guide_release_renders_no_metrics_url_and_waits_for_the_port() -> None:
    plan = load_plan("layerwise-sparse-1p1d")
    assert "metrics_url" not in _meta(plan)
    h = plan.process("metaservice").health
    assert h is not None
    assert h.url == ""
    assert h.ready_port == 5000
    assert h.ready_log == ""  # logged at WARNING: `log_level = error` never prints it


def test_guide_release_with_a_verbose_log_also_waits_for_the_ready_line() -> None:
    h = load_plan("layerwise-sparse-1p1d", sets=["kv.memcache.log_level=warn"])
    health = h.process("metaservice").health
    assert health is not None
    assert health.ready_log == "Meta Service launched successfully"


def test_1_3_renders_metrics_url_and_http_health() -> None:
    plan = load_plan("layerwise-sparse-1p1d", sets=['kv.memcache.version="1.3"'])
    assert "ock.mmc.meta_service.metrics_url = http://192.168.20.1:8000" in _meta(plan)
    h = plan.process("metaservice").health
    assert h is not None
    assert h.url == "http://192.168.20.1:8000/health"
