"""Whether a plan rehearses, as one value every stage of the plan reads (pure).

A rehearsal changes a few things downstream of the substitution itself: the interpreters of
kvpd's node-side processes, the hardware a container is made for, the data directories, the
log lines that can appear. Each of those asks this value instead of a flag threaded through."""

from __future__ import annotations

from dataclasses import dataclass

from kvpd.profile.schema import Profile


@dataclass(frozen=True)
class Rehearsal:
    """`engine`: the rehearsal engine's name (kvpd.plan.rehearse.ENGINES); None: the real
    deployment."""

    engine: str | None = None

    @classmethod
    def of(cls, rehearse: bool | str, default_engine: str) -> Rehearsal:
        """From the CLI's value: False (real), True (the default engine) or an engine's name."""
        if not rehearse:
            return REAL
        return cls(default_engine if rehearse is True else rehearse)

    @property
    def on(self) -> bool:
        return self.engine is not None

    def python(self, profile: Profile) -> str:
        """The python of kvpd's node-side processes (proxy, supervisor)."""
        return profile.rehearsal.python if self.on else profile.runtime.python

    def vllm(self, profile: Profile) -> str:
        return profile.rehearsal.vllm if self.on else profile.runtime.vllm

    def engine_python(self, profile: Profile, host: str) -> str:
        """The interpreter of the engine processes on `host` (the node bundle's engine slot):
        vLLM's own (`@vllm`: the interpreter of that console script), or the Python kvpd's
        stand-in engine runs with there."""
        if self.engine == STANDIN:
            return profile.rehearsal.standin_python_on(host)
        return "@" + self.vllm(profile)


STANDIN = "standin"  # the name of kvpd's stand-in rehearsal engine (`--rehearse-with standin`)
CPU_VLLM = "vllm"  # the CPU vLLM rehearsal engine's name (`--rehearse-with vllm`)


REAL = Rehearsal()
REHEARSING = Rehearsal("any")  # for a caller that only asks `on` and the interpreters
