"""Error types: the CLI maps KvpdError subclasses to exit codes and prints them plainly."""

from __future__ import annotations


class KvpdError(Exception):
    """Base of every error a user can act on. `exit_code` 2 = bad input, 1 = runtime failure."""

    exit_code = 1


class ProfileError(KvpdError):
    """The profile is malformed or violates a rule; carries one or more located messages."""

    exit_code = 2

    def __init__(self, problems: list[str] | str, source: str = "") -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        if len(self.problems) == 1:
            msg = head + self.problems[0]
        else:
            msg = f"{head}{len(self.problems)} problems:\n" + "\n".join(
                f"  - {p}" for p in self.problems
            )
        super().__init__(msg)


class PlanError(KvpdError):
    """The plan cannot be built (e.g. dependency cycle)."""

    exit_code = 2


class TransportError(KvpdError):
    """A host could not be reached or a remote operation failed."""


class HostKeyError(TransportError):
    """The host's SSH key is unknown or does not match known_hosts."""


class DeployError(KvpdError):
    """`up` failed; everything this run started has been stopped."""


class HealthTimeout(DeployError):
    """A process did not become healthy before its deadline."""


class StateError(KvpdError):
    """The deployment state is missing, corrupt or conflicts with the request."""


class BenchError(KvpdError):
    """A benchmark could not run or its result fails a gate."""
