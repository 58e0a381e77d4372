"""The end of a lot: what a renter runs from another shell and when the work is done.

status.py  batch_status, follow: ``docpilot status`` (progress, lease verdict, the detached run's log and exit)
wrapup.py  wrap_up: ``docpilot wrap-up``, every adapter and run copied off the pod and re-checked, then the stop
stop.py    stop_settings, check_stop_command, stop_the_meter: the lease's stop command, run only after a verified copy

Detaching (``--detach``, ``--stop-when-done``) is done to a command by the front door (``docpilot/detach.py``);
the records it leaves are ``classify/runs/detached.py``.
"""
