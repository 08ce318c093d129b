"""Crash class: inputs that used to end in a traceback, an internal error or a
minute of CPU. Each must now exit 2 with a located message, fast."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvpd.errors import ProfileError
from kvpd.plan.build import load_plan
from kvpd.profile.load import parse_profile

LW = "layerwise-sparse-1p1d"
BOMB = """a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def kvpd(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvpd.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def parse_error(text: str) -> str:
    with pytest.raises(ProfileError) as e:
        parse_profile(text, "p.yaml")
    return str(e.value)


def test_dp_address_naming_no_host_is_a_located_message() -> None:
    with pytest.raises(ProfileError) as e:
        load_plan("large-ep", sets=["decode.dp_address=nowhere"], base_dir="/srv/kvpd")
    assert "decode.dp_address: unknown host 'nowhere'." in str(e.value)


def test_dp_address_not_on_rank_0_is_refused() -> None:
    with pytest.raises(ProfileError) as e:
        load_plan("large-ep", sets=["decode.dp_address=d2"], base_dir="/srv/kvpd")
    assert "dp_address 'd2' is not where decode DP rank 0 runs ('d1')" in str(e.value)
    assert "Set dp_address: d1" in str(e.value)


def test_binary_file_is_not_a_profile(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01")
    r = kvpd("plan", str(f))
    assert r.returncode == 2
    assert "not a text file (byte 0 is not UTF-8)" in r.stderr
    assert "\\x" not in r.stderr


def test_alias_bomb_is_refused_quickly() -> None:
    start = time.perf_counter()
    msg = parse_error(BOMB)
    assert time.perf_counter() - start < 1.0
    assert "expands to more than 200000 values" in msg


def test_recursive_alias_is_refused() -> None:
    assert "an alias refers to itself" in parse_error("a: &a [1, *a]\n")


def test_directory_is_named_as_a_directory(tmp_path: Path) -> None:
    r = kvpd("plan", str(tmp_path))
    assert r.returncode == 2
    assert "is a directory, not the profile file" in r.stderr


def test_huge_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "big.yaml"
    f.write_text("# " + "x" * (2 << 20) + "\n")
    r = kvpd("plan", str(f))
    assert r.returncode == 2
    assert "too large for a profile" in r.stderr


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("? [a, b]\n: 1\n", "a key must be plain text"),
        ("a: !!python/name:os.system ''\n", "cannot read this value"),
        ('name: "a\\0b"\n', "contains a NUL character"),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", "p.yaml"),
        ("- just a list\n", "a profile is a YAML mapping"),
    ],
)
def test_odd_yaml_gets_a_message(text: str, expect: str) -> None:
    assert expect in parse_error(text)


def test_model_config_that_is_not_a_config(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('["not", "a", "mapping"]')
    with pytest.raises(ProfileError, match="model.config: .* is not a config.json mapping"):
        load_plan(LW, sets=[f"model.config={bad}"], base_dir="/srv/kvpd")


def test_unwritable_out_directory_is_an_error_not_a_crash(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = kvpd("plan", LW, "--out", str(blocker / "sub"))
    assert r.returncode == 2
    assert "cannot write the plan there" in r.stderr
    assert "internal error" not in r.stderr


def test_rich_markup_in_profile_text_is_shown_literally(tmp_path: Path) -> None:
    r = kvpd(
        "plan",
        "ucm-centralized-2p2d",
        "--set",
        "kv.ucm.storage=/mnt/[/x]",
        "--set",
        "kv.ucm.shared=null",
        "--set",
        'model.served_name="[/y]"',
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "/mnt/[/x] must be one shared filesystem" in r.stdout
    assert "(model [/y])" in r.stdout


def test_each_alias_use_is_its_own_value() -> None:
    from kvpd.profile.load import _compose

    data, _ = _compose("a: &x {b: 1}\nc: *x\n", "p.yaml")
    data["c"]["b"] = 2
    assert data["a"] == {"b": 1}
