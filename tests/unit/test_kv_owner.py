"""One login user per shared KV folder, refused at plan time with the fix."""

from __future__ import annotations

import pytest

from kvpd.errors import ProfileError
from kvpd.plan.build import load_plan
from kvpd.plan.kv_owner import mixed_owners
from kvpd.plan.value import HostRequirements, HostSpec

PROFILE = "ucm-centralized-2p2d"


def _hosts(*users: str | None) -> list[HostSpec]:
    return [HostSpec(f"h{i}", f"10.0.0.{i}", user=u) for i, u in enumerate(users, 1)]


def test_hosts_sharing_a_folder_as_different_users_are_named_with_the_fix() -> None:
    need = {f"h{i}": HostRequirements(shared_dirs=("/kv",)) for i in (1, 2, 3)}
    (msg,) = mixed_owners(_hosts("root", "kvpd", "root"), need)
    assert "/kv" in msg, msg
    assert "h2 as kvpd; h1, h3 as root" in msg, msg
    assert "Fix: log in as one user" in msg, msg
    assert "ssh.user" in msg, msg


def test_one_user_unknown_users_and_unshared_folders_pass() -> None:
    need = {"h1": HostRequirements(shared_dirs=("/kv",)), "h2": HostRequirements(("/kv",))}
    need = {
        "h1": HostRequirements(shared_dirs=("/kv",)),
        "h2": HostRequirements(shared_dirs=("/kv",)),
    }
    assert mixed_owners(_hosts("kvpd", "kvpd"), need) == []
    assert mixed_owners(_hosts("kvpd", None), need) == []  # ssh picks the user: preflight's
    other = {
        "h1": HostRequirements(shared_dirs=("/a",)),
        "h2": HostRequirements(shared_dirs=("/b",)),
    }
    assert mixed_owners(_hosts("root", "kvpd"), other) == []


def test_the_cpu_rehearsal_refuses_a_decoder_of_another_user_on_its_hand_over_folder() -> None:
    sets = ["hosts.d1.ssh.user=kvpd", "ssh.user=root"]
    with pytest.raises(ProfileError) as e:
        load_plan(PROFILE, rehearse="vllm", sets=sets)
    text = str(e.value)
    assert "different users" in text, text
    assert "d1" in text, text
    assert "as kvpd" in text, text
    # the stand-in rehearsal shares no KV folder: mixed users are fine there
    assert load_plan(PROFILE, rehearse="standin", sets=sets)
    assert load_plan(PROFILE, rehearse="vllm", sets=["ssh.user=kvpd"])
