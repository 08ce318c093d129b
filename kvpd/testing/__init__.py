"""Test doubles users may want too (as `fabric.testing` does): stand-ins for what cannot run
here, for fault injection and benchmarks. Not used by kvpd's own commands."""
