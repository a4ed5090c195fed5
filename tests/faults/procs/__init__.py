"""Programs the fault scenarios run as separate processes (``python -m tests.faults.procs.NAME``)."""
