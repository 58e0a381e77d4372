"""The ``docpilot`` command: the front door above the ``classify``, ``batch``, ``adapters`` and ``serve`` packages.

Nothing below this package imports it: the shared core (``classify``) and the packages that use it
never reach up to the command line. Run it as ``docpilot COMMAND ...`` or ``python -m docpilot COMMAND ...``.

cli.py          ``COMMANDS`` and ``DETACHABLE`` by import string, ``main``: errors -> exit codes, ``--verbose``
logs.py         logging set up once (``configure_logging``, ``log_lines``) and the libraries kept quiet
detach.py       ``--detach`` / ``--stop-when-done``: the supervisor, ``exit.json``, the wrap-up and the lease's stop
__main__.py     ``python -m docpilot``
"""
