"""Render config files and launch scripts from templates (pure: text in, text out)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jinja2

from kvpd.plan.processes import ProcessDraft
from kvpd.plan.quoting import ENV_NAME, command_lines, quote, quote_expanding


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("kvpd", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = quote
    env.filters["qx"] = quote_expanding
    return env


def render(template: str, **context: Any) -> str:
    try:
        return _env().get_template(template).render(**context)
    except jinja2.TemplateError as e:  # a bug in kvpd, not in the profile
        line = getattr(e, "lineno", None)
        raise RuntimeError(f"Template {template} (L{line}): {e}") from e


def launch_script(
    proc: ProcessDraft,
    deployment: str,
    log: str,
    dirs: list[str] | None = None,
    supervisor: tuple[str, ...] = (),
) -> str:
    """The launch script of `proc`. Env names go into the script unquoted (`export NAME=...`):
    the schema allows only identifiers, and this is the last guard against a kvpd bug."""
    for name, _ in proc.env:
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"refusing to render env name {name!r} into a launch script")
    return render(
        "launch.sh.j2",
        dirs=dirs or [],
        proc=proc,
        host=proc.host,
        deployment=deployment,
        log=log,
        command=command_lines(proc.argv),
        supervisor=supervisor,
    )
