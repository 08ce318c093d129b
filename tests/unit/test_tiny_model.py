"""The tiny model builder: same seed gives the same bytes; a missing engine is a clear error."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvpd.cli.main import main
from kvpd.engine.venv import EngineNotInstalled, engine_python

REPO = Path(__file__).resolve().parents[2]


def _engine() -> Path:
    try:
        return engine_python()
    except EngineNotInstalled as e:
        pytest.skip(f"CPU engine venv not installed (run `make engine`): {e}")


def _build(python: Path, builds: dict[Path, int]) -> None:
    """Build each model (folder -> seed) in a process of its own, all at once: each spends most
    of its time importing the engine's libraries, which the others need not wait for."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = {
        out: subprocess.Popen(
            [str(python), "-m", "kvpd.engine.tiny", str(out), "--seed", str(seed)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for out, seed in builds.items()
    }
    for out, proc in procs.items():
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, (out, output.decode(errors="replace")[-3000:])


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    python = _engine()
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _build(python, {a: 0, b: 0, c: 1})

    files_a = _files(a)
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(
        files_a
    )
    assert files_a == _files(b)
    files_c = _files(c)
    assert files_c["model.safetensors"] != files_a["model.safetensors"]
    assert files_c["tokenizer.json"] == files_a["tokenizer.json"]  # the seed only drives weights

    cfg = json.loads(files_a["config.json"])
    assert cfg["head_dim"] == 32
    assert cfg["num_hidden_layers"] == 2
    assert "<|im_start|>" in files_a["chat_template.jinja"].decode()


def test_rebuild_is_skipped_when_up_to_date(tmp_path: Path, capsys) -> None:
    _engine()
    out = tmp_path / "m"
    with pytest.raises(SystemExit) as first:
        main(["model", "tiny", str(out), "--seed", "3"])
    assert first.value.code in (0, None)
    before = _files(out)
    with pytest.raises(SystemExit) as second:
        main(["model", "tiny", str(out), "--seed", "3"])
    assert second.value.code in (0, None)
    assert _files(out) == before


def test_missing_engine_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("KVPD_ENGINE_PYTHON", str(tmp_path / "nope" / "python"))
    with pytest.raises(SystemExit) as exc:
        main(["model", "tiny", str(tmp_path / "m")])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "make engine" in err
    assert str(tmp_path / "nope") in err
    assert not (tmp_path / "m").exists()
