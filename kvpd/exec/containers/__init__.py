"""Containers on the nodes: the transport into one, starting and removing them (life), and
what preflight checks of the container runtime."""
