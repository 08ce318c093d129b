"""The rendered launch script, run by bash: vendor set_env.sh scripts are sourced before
`set -e`, so a command in them that fails harmlessly does not end the launch."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kvpd.plan.processes import ProcessDraft
from kvpd.plan.render import launch_script


def test_a_failing_command_in_set_env_does_not_stop_the_launch(tmp_path: Path) -> None:
    set_env = tmp_path / "set_env.sh"
    set_env.write_text("false\nexport FROM_SET_ENV=yes\n")  # e.g. a probe for an optional lib
    proc = ProcessDraft(
        name="p", host="h", role="prefill", stage=1,
        argv=("sh", "-c", 'echo "started $FROM_SET_ENV $A"'), env=(("A", "1"),),
        source=(str(set_env),),
    )  # fmt: skip
    script = tmp_path / "run" / "p" / "launch.sh"
    script.parent.mkdir(parents=True)
    script.write_text(launch_script(proc, "d", "logs/p.log"))
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r
    assert r.stdout.strip() == "started yes 1", r
    # after the sources a failing step still ends the script
    text = script.read_text()
    assert text.index("source ") < text.index("set -e") < text.index("export A=")
