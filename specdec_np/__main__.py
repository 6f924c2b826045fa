"""`python -m specdec_np`: the command line lives with the tools (`specdec_np/tools/cli.py`)."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
