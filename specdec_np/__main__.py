"""`python -m specdec_np` and the `specdec-np` console script: the command line lives with the tools
(`specdec_np/tools/cli.py`)."""

import signal
import sys


def main() -> int:
    """The command line's exit status; a Ctrl-C while NumPy and the rest load (a moment) ends as it does
    in the command line (one line, 130)."""
    try:
        from .tools.cli import main as cli_main
    except KeyboardInterrupt:
        if sys.stderr is not None:  # None: started with standard error closed
            sys.stderr.write("interrupted\n")
        return 130
    code = cli_main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the work is done: a Ctrl-C while Python exits changes nothing
    return code


if __name__ == "__main__":
    sys.exit(main())
