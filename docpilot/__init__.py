"""The ``docpilot`` command: the front door above the ``classify``, ``batch``, ``adapters`` and ``serve`` packages.

Nothing below this package imports it: the shared core (``classify``) and the packages that use it
never reach up to the command line. Run it as ``docpilot COMMAND ...`` or ``python -m docpilot COMMAND ...``.
"""
