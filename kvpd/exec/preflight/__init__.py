"""Preflight: read-only checks on every host of a plan, one table with a fix hint per failure.

- run.py: `run_checks`, the entry the deployment service calls; it probes each host and asks
  the checks below.
- checks.py: one check's outcome (`Check`), also what the bundle's and the container
  runtime's preflights return (kvpd.exec.bundle.preflight, kvpd.exec.containers.preflight).
- probe.py: the stdlib-only script run on each host; verdict.py: its output judged (pure).
- channels.py, owners.py, planner_gate.py, pinned_versions.py, versions.py: the checks that
  ask a host more than the probe does (a channel to its own port, the engines' uid per shared
  KV folder, the sparse planner, the pinned releases, the KV services' versions).
"""
