"""Profile -> plan: derivation, validation rules, port ledger, rendering. Pure functions only.

A process goes through one named value per stage of the pipeline:

- `layout.EnginePlacement`: where an engine runs (host, DP ranks, devices, port);
- `processes.ProcessDraft`: a derived process (argv, env, ports) before rendering, which the
  rehearsal transform and the node bundle may rewrite;
- `value.ProcessSpec`: the process in the plan (its launch script rendered) — what `up` runs;
- `exec.state.ProcessRecord`: a started process (PID, start time), in the deployment state;
- `exec.processes.status.ProcessStatus`: what `kvpd status` observed of it.

Roles are `kvpd.profile.roles.Role`.
"""
