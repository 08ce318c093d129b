"""The processes `up` started, seen from the controller, through their hosts' transports.

- health.py: one HTTP health probe of a process; readiness.py: how `up` reads a process that
  is not healthy yet (port and log line, "still initialising").
- status.py: what `kvpd status` reports of each recorded process.
- supervised.py: a supervised process's status file on its host, read-only.
- stop.py: stopping recorded processes (SIGTERM to the group, grace period, SIGKILL, verify).

The /proc rules they rest on are the transports' (kvpd.exec.procfs).
"""
