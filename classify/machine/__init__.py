"""The machine: what it has and what this process computes on. The ground floor of the core.

probe.py        what this machine has (cards, driver) and the install profile; standard library only, run by
                ``make setup`` with the system Python before any venv (``python3 -m classify.machine.probe``)
python_gate.py  the refusal of a Python the pinned wheels do not serve; run by path on any Python 3, first
device.py       torch's view: the device a run computes on, the dtype ``auto`` means there, the C++ compiler
"""
