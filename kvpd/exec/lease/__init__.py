"""The deployment's lease: one change (`up`, `down`, `restart`) at a time, across controllers.

- model.py: the lease as data (pure): the record, parsing what a lease host reports, the
  decision whether a controller may take it.
- host.py: taking, renewing and releasing it on the lease host, through its transport.
- scope.py: which of the deployment service's verbs hold it, and for how long.
"""
