"""Host records: each host's run dir holds the record of what kvpd started there.

The controller's state.json is a cache; the hosts hold the truth, so any controller with the
profile can see, restart and stop a deployment (and a lost laptop loses nothing). A record is
input, never code: every field is validated against the plan the controller builds from the
profile now, and commands, scripts and hosts always come from that plan.

- model.py: the record's shape, the per-process launch digest, who started it.
- validate.py: a record read from a host, checked field by field against the plan.
- hostio.py: reading, writing and removing records and the per-user index on a host.
- writer.py: how `up`, `restart` and `down` keep a host's record in step as they act.
- current.py: the deployment as its hosts record it (state, drift), for every verb.
- conflicts.py: other kvpd deployments holding this plan's ports, devices or run dirs.
"""
