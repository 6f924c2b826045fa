"""`python -m specdec_np`: the command line lives with the tools (`specdec_np/tools/cli.py`)."""

import signal
import sys

if __name__ == "__main__":
    try:  # Ctrl-C while NumPy and the rest load (a moment) ends as it does in the command line
        from .tools.cli import main
    except KeyboardInterrupt:
        if sys.stderr is not None:  # None: started with standard error closed
            sys.stderr.write("interrupted\n")
        sys.exit(130)
    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the work is done: a Ctrl-C while Python exits changes nothing
    sys.exit(code)
