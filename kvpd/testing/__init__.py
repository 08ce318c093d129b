"""Public test doubles for code built on kvpd (transports, backends): stand-ins, named as such."""
