"""Command-line interface: one module per verb, registered lazily in `main.py`."""
