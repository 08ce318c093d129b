"""Explaining a failed deployment.

- causes.py: a process's likely failure cause from its log (pure), for `up` and `kvpd diagnose`.
- gather.py: `kvpd diagnose`: what explains a deployment's state, from every host, read-only.
- redact.py: masking secrets in what gather collects.
"""
