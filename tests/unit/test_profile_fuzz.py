"""Fuzz: bundled profiles mutated (types, ranges, hostile strings, unicode, huge numbers) must
plan (exit 0) or be refused with messages (exit 2), never crash; and every launch script of a
plan that passes parses with `bash -n` and, run with its commands recorded, runs nothing but
kvpd's own steps and execs exactly the planned command with the planned environment."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpd.cli.main import main
from kvpd.profile.load import bundled_names
from tests.unit.launch_harness import run_recorded, syntax_ok

PROFILES = {
    n: yaml.safe_load((resources.files("kvpd") / "profiles" / f"{n}.yaml").read_text())
    for n in bundled_names()
}
HOSTILE = [
    "",
    " ",
    "a;b",
    "$(touch pwned)",
    "`id`",
    "x\ny",
    "'",
    '"',
    "\\",
    "*",
    "../..",
    "/..",
    "{{ x }}",
    "%s",
    "[/red]",
    "[bold]x",
    "ünï",
    "\u202e",
    "a: b",
    "- x",
    "&a",
    "!!x",
    "#",
    "0",
    "-1",
    "1e999",
    "true",
    "null",
    "~",
    "\t",
    "a=b",
    "${HOME}",
    "$HOME",
    "--port",
    "192.168.10.2; touch x",
    "::1",
    "0.0.0.0",
    "localhost",
    "p1",
    "d1",
    "n1",
    "all",
]
SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2, -1, 65535, 65536, 2**31, 2**64]),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from(HOSTILE),
    st.text(max_size=12),
)
VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=3),
    st.dictionaries(
        st.sampled_from(HOSTILE[:12] + ["port", "tp", "PYTHONHASHSEED"]), SCALARS, max_size=2
    ),
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(data: Any, path: tuple[Any, ...], op: int, value: Any, key: str) -> Any:
    if not path:
        return data
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if op == 0 or not isinstance(parent, dict):
        parent[last] = value
    elif op == 1:
        del parent[last]
    elif op == 2:
        parent[key] = parent.pop(last)  # rename a key (env names, host names, fields)
    else:
        parent[key] = value  # add a key beside it
    return data


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, str]:
    name = draw(st.sampled_from(sorted(PROFILES)))
    data = json.loads(json.dumps(PROFILES[name]))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(data)[1:]
        path = paths[draw(st.integers(min_value=0, max_value=len(paths) - 1))]
        op = draw(st.integers(min_value=0, max_value=3))
        key = draw(st.sampled_from(HOSTILE + ["EVIL;touch x;X", "../../x", "extra"]))
        data = _mutate(data, path, op, draw(VALUES), key)
    return name, yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


def _cli(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue() + err.getvalue()


def _check_scripts(out: Path) -> None:
    plan = json.loads((out / "plan.json").read_text())
    for proc in plan["processes"]:
        script = out / proc["host"] / proc["script"]
        r = syntax_ok(script)
        assert r.returncode == 0, f"{script}: {r.stderr}"
        plain = [(k, v) for k, v in proc["env"] if v != "****" and "$" not in v]
        run = run_recorded(script, [k for k, _ in plain])
        assert run.returncode == 0, run.stderr
        assert run.foreign_commands() == [], run.foreign_commands()
        execs = run.kind("EXEC")
        assert len(execs) == 1, (execs, proc["command"])
        assert execs[0] == proc["command"], (execs, proc["command"])
        got = dict((k, v) for k, v in (e for e in run.kind("ENV")))
        assert got == dict(plain), (got, plain)


@settings(
    max_examples=120,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mutated())
def test_mutated_profiles_plan_or_are_refused_never_crash(case: tuple[str, str]) -> None:
    name, text = case
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        prof = Path(tmp) / f"{name}.yaml"
        prof.write_text(text)
        out = Path(tmp) / "out"
        code, shown = _cli(["plan", str(prof), "--out", str(out)])
        assert code in (0, 2), shown
        assert "Traceback" not in shown, shown
        assert "internal error" not in shown, shown
        if code == 0:
            _check_scripts(out)


SHELL_HOSTILE = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(
        alphabet=st.sampled_from("\x1f\x01$`'\"\\;|&<>(){}[]*?!#~ \n\tab-=:/.é\u202e"),
        max_size=16,
    ),
)


@st.composite
def hostile_strings(draw: st.DrawFn) -> tuple[str, str]:
    """A hostile string in place of string values that reach launch scripts (commands, paths,
    env values, extra args): most of these profiles still plan, so their scripts are run."""
    name = draw(st.sampled_from(sorted(PROFILES)))
    data = json.loads(json.dumps(PROFILES[name]))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        where = draw(
            st.sampled_from(
                [
                    "model.path",
                    "model.served_name",
                    "env.X_FUZZ",
                    "engine.args",
                    "runtime.vllm",
                    "runtime.kvpd",
                ]
            )
        )
        value = draw(SHELL_HOSTILE)
        head, _, leaf = where.partition(".")
        node = data.setdefault(head, {})
        if leaf == "args":
            node[leaf] = ["--disable-log-stats", value] if value.startswith("-") else [value]
        else:
            node[leaf] = value
    return name, yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


@settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(hostile_strings())
def test_hostile_strings_never_escape_their_quotes(case: tuple[str, str]) -> None:
    test_mutated_profiles_plan_or_are_refused_never_crash.hypothesis.inner_test(case)  # type: ignore[attr-defined]


def test_the_harness_catches_an_injected_command(tmp_path: Path) -> None:
    script = tmp_path / "launch.sh"
    script.write_text("set -e\nexport A=$(touch pwned)\n/bin/true\nrm -rf x\nexec vllm serve\n")
    run = run_recorded(script, ["A"])
    foreign = run.foreign_commands()
    assert any("touch" in c for c in foreign)
    assert any("rm" in c for c in foreign)
    assert any(c.startswith("/bin/true") for c in foreign)
