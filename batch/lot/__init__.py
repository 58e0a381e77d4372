"""The end of a lot: what a renter runs from another shell and when the work is done.

status.py  batch_status, follow: ``docpilot status`` (progress, lease verdict, the detached run's log and exit)
wrapup.py  wrap_up: ``docpilot wrap-up``, every adapter and run copied off the pod and re-checked, then the lease's
           stop (``batch/lease/stop.py``)

Detaching (``--detach``, ``--stop-when-done``) is done to a command by the front door (``docpilot/detach.py``);
the records it leaves are ``classify/runs/detached.py``.
"""
