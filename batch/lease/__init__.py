"""The lease: when it ends, whether the batch fits in it, and the stop command run once every copy is verified.

clock.py  lease_end, parse_lease_end, lease_check, LeaseWatch, eta_text: the lease clock (``--lease-ends`` or the
          lots config's ``lease_ends_at``) against the running batch and its export
stop.py   stop_settings, check_stop_command, stop_the_meter: the lease's stop command, run only after a verified copy

The lots config's ``lease`` section (:class:`batch.plan.lots.LeaseSection`) is the lots file's, one floor down.
"""
