"""kvpd: plan, start, benchmark and stop P/D-disaggregated vLLM deployments."""

__version__ = "0.1.0"
