"""How `--rehearse` runs a profile's topology on CPU hosts: the profile's `rehearsal:` section."""

from __future__ import annotations

from pydantic import Field

from kvpd.profile.base import _Model
from kvpd.profile.types import Command, HostName


class Rehearsal(_Model):
    """How `--rehearse` runs this topology on CPU hosts (usually given in an inventory file).

    Engines become CPU `vllm serve`s of a tiny model, Ascend-only KV connectors become
    ExampleConnector over a shared folder; the memcache MetaService and the Mooncake master run
    for real from a Python environment that has memcache-hybrid / mooncake installed.
    """

    model: Command = Field(
        ".kvpd/models/tiny", description="tiny model dir, same path on all hosts"
    )
    vllm: Command = Field("vllm", description="CPU vLLM command on the hosts")
    kvpd: Command = Field("kvpd", description="kvpd command on the proxy host")
    python: Command = Field("python3", description="python with memcache-hybrid installed")
    mooncake_master: Command = Field("mooncake_master", description="mooncake_master command")
    storage: Command = Field(".kvpd/rehearsal/kv", description="shared folder for KV hand-over")
    cores: int = Field(2, ge=1, description="CPU cores to spread the engines over")
    health_timeout_s: float = Field(600, gt=0)
    standin_python: dict[HostName, Command] = Field(
        default_factory=dict,
        description="per host: the Python kvpd's stand-in engines run with there (default: "
        "`python`), e.g. an arm64 CPython under qemu on one host",
    )

    def standin_python_on(self, host: str) -> str:
        """The interpreter of the stand-in engines on `host` (`--rehearse-with standin`)."""
        return self.standin_python.get(host, self.python)
