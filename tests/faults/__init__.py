"""Fault-injection scenarios (``pytest -m faults``): pauses, kills, cut connections, clocks."""
