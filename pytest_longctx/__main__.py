"""``python -m pytest_longctx``: the command line lives in :mod:`pytest_longctx.cli`."""

import sys

from pytest_longctx.cli import main

if __name__ == "__main__":
    sys.exit(main())
