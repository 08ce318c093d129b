"""The node bundle: kvpd on every host slot that imports it (installer, run, host, node),
built once per platform (wheel, wheel_build, wheel_cache, wheel_trust, builds), checked
read-only before `up` (preflight)."""
