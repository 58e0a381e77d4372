"""``python -m docpilot COMMAND ...``: the same as the ``docpilot`` console command."""

import sys

from docpilot.cli import main

if __name__ == "__main__":
    sys.exit(main())
