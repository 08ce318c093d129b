"""The per-host `container` setting: run that host's processes inside a container.

`name` alone: kvpd execs into a container the user runs. `image`: kvpd starts it (`name`
defaults to kvpd-<deployment>) before the first stage and removes it on `down`. Cross-field
rules (absolute paths, the stand-in's limits) live in kvpd.plan.rules.containers.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kvpd.profile.base import _Model
from kvpd.profile.types import Command

# Docker's own rule for container names, `[a-zA-Z0-9][a-zA-Z0-9_.-]+`: at least two characters
# (podman accepts the same set).
CONTAINER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{1,127}$"
# An image reference: [registry[:port]/]path[:tag][@sha256:digest] (docker's grammar, lower
# case path components); anything else could be read as an option by the runtime.
IMAGE = (
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)

# How profile messages describe these patterns (kvpd.profile.messages).
PATTERN_TEXT = {
    CONTAINER_NAME: "a container name of letters, digits, '_', '.' and '-' that starts with a "
    "letter or digit (2 to 128 characters), e.g. vllm-ascend",
    IMAGE: "an image reference [registry[:port]/]path[:tag][@sha256:digest] with a lower-case "
    "path, e.g. quay.io/ascend/vllm-ascend:v0.11.0rc1",
}

ContainerName = Annotated[str, Field(pattern=CONTAINER_NAME)]
Image = Annotated[str, Field(pattern=IMAGE, max_length=512)]

# "standin": kvpd's namespace stand-in for tests (unshare + nsenter, no image, no isolation
# beyond mount and PID namespaces); never a production runtime.
ContainerRuntime = Literal["docker", "podman", "standin"]


class Container(_Model):
    """Run every process kvpd starts on this host inside a container, over the same SSH."""

    runtime: ContainerRuntime = Field(
        "docker", description="docker | podman (standin: kvpd's namespace stand-in for tests)"
    )
    name: ContainerName | None = Field(
        None, description="container to exec into (with `image`: the name kvpd gives it)"
    )
    image: Image | None = Field(
        None, description="image kvpd starts the container from (`up`) and removes (`down`)"
    )
    command: Command | None = Field(
        None,
        description="the runtime's program on the host (default: docker, podman, or "
        "kvpd-standin-runtime)",
    )
    shm_gb: float | None = Field(
        None, gt=0, le=4096, description="--shm-size in GiB (default: what the plan needs + 1)"
    )
