"""What one of a host's `devices` is on each hardware, and the memory behind it (pure facts).

`devices` counts what the runtime enumerates and what ASCEND_RT_VISIBLE_DEVICES /
CUDA_VISIBLE_DEVICES index: on Atlas A3 npu-smi lists every Ascend 910C chip as two dies, so an
A3 server has 16 devices of half a chip each; A2 (910B) and 950 list whole chips. The HBM per
device is the common server part's (vendor data sheets); `hosts.<h>.device_memory_gb` states
another (a 32 GB 910B4, a 144 GB 950DT).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpd.profile.schema import Host, Profile


@dataclass(frozen=True)
class DeviceKind:
    unit: str  # what one counted device is: die, chip, GPU, core
    dies_per_chip: int
    memory_gb: float | None  # HBM of one counted device (GiB); None: not known here
    per_server: tuple[int, ...]  # device counts the servers come in (empty: any)
    server: str  # the server the counts are of


KINDS: dict[str, DeviceKind] = {
    "a2": DeviceKind("chip", 1, 64.0, (8,), "Atlas 800 A2 (Ascend 910B): 8 chips of 64 GB"),
    "a3": DeviceKind(
        "die", 2, 64.0, (16,), "Atlas 800 A3 (Ascend 910C): 8 chips of 2 dies, 64 GB a die"
    ),
    "950": DeviceKind("chip", 1, 128.0, (8,), "Atlas 950 (Ascend 950PR): 8 chips of 128 GB"),
    "cuda": DeviceKind("GPU", 1, None, (), "a GPU server"),
    "cpu": DeviceKind("core", 1, None, (), "a CPU host (devices are cores)"),
}


def hardware(profile: Profile, host: Host) -> str:
    return host.hardware or profile.hardware


def kind(profile: Profile, host: Host) -> DeviceKind:
    return KINDS[hardware(profile, host)]


def device_memory_gb(profile: Profile, host: Host) -> float | None:
    """HBM of one counted device: the host's `device_memory_gb`, else its hardware's."""
    if host.device_memory_gb is not None:
        return host.device_memory_gb
    return kind(profile, host).memory_gb


def describe(profile: Profile, host: Host, devices: tuple[int, ...]) -> str:
    """`8 dies 0-7 = 4 chips 0-3, 8 x 64 GB = 512 GB HBM` (chips and dies where they differ)."""
    k = kind(profile, host)
    n = len(devices)
    text = f"{n} {k.unit}{'' if n == 1 else 's'} {_span(devices)}"
    if k.dies_per_chip > 1:
        chips = tuple(sorted({d // k.dies_per_chip for d in devices}))
        text += f" = {len(chips)} chip{'' if len(chips) == 1 else 's'} {_span(chips)}"
        if n % k.dies_per_chip or len(chips) * k.dies_per_chip != n:
            text += " (a chip split with another engine)"
    mem = device_memory_gb(profile, host)
    if mem is not None:
        text += f", {n} x {mem:g} GB = {n * mem:g} GB HBM"
    return text


def _span(xs: tuple[int, ...]) -> str:
    if not xs:
        return ""
    if list(xs) == list(range(xs[0], xs[-1] + 1)) and len(xs) > 1:
        return f"{xs[0]}-{xs[-1]}"
    return ",".join(str(x) for x in xs)
