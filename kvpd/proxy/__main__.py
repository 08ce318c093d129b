"""`python -m kvpd.proxy ...`: the same as `kvpd proxy ...`."""

from __future__ import annotations

import sys

from kvpd.errors import KvpdError
from kvpd.proxy.app import run_from_argv


def main() -> None:
    try:
        run_from_argv(sys.argv[1:])
    except KvpdError as e:
        print(f"kvpd proxy: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
