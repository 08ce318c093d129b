"""`kvpd native info`: which sparse-KV planner implementation is active and how it was built."""

from __future__ import annotations

import json

import typer


def info(
    as_json: bool = typer.Option(False, "--json", help="Print the facts as JSON."),
) -> None:
    """Show the active implementation (native or NumPy), compiler, OpenMP threads and ISA."""
    from kvpd.native import implementation_info

    facts = implementation_info()
    if as_json:
        print(json.dumps(facts, indent=2))
        return
    openmp = facts.get("openmp")
    rows = [
        ("implementation", facts["implementation"]),
        ("machine", facts["machine"]),
        ("compiler", facts.get("compiler") or "-"),
        ("OpenMP", f"{openmp} ({facts['max_threads']} threads)" if openmp else "-"),
        ("ISA flags", facts.get("isa_flags") or "-"),
        ("ISA features", facts.get("isa_features") or "-"),
    ]
    planner = facts.get("ascend_planner")
    rows.append(
        (
            "vLLM-Ascend planner",
            f"kvpd.native.ascend_planner ({planner} row planner)"
            if planner
            else f"unavailable: {facts.get('ascend_planner_reason')}",
        )
    )
    if facts.get("module"):
        rows.append(("module", facts["module"]))
    if facts.get("reason"):
        rows.append(("why NumPy", facts["reason"]))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    if facts["implementation"] != "native" and (facts.get("reason") or "").startswith("ext"):
        print(
            "\nTo build the native core: install a C++17 compiler with OpenMP (Debian/Ubuntu: "
            "apt-get install g++) and reinstall kvpd (pip install --force-reinstall kvpd, or "
            "pip install -e . in a checkout)."
        )


def register(app: typer.Typer) -> None:
    native = typer.Typer(help="The native offload core (sparse-KV hot-buffer planner).")
    app.add_typer(native, name="native")

    native.command("info")(info)
