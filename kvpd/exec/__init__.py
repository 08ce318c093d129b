"""Side effects live here: transports to hosts, the executor, deployment state."""
