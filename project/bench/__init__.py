"""The lease benchmark: ``python manage.py lease_bench`` (see docs/benchmarks.md).

Part of the demo project, not of the reusable app: it measures ``resource_lease`` against the
SQL floor, the original SELECT-then-UPDATE algorithm, redis-py's Lock and MySQL's GET_LOCK,
with real worker processes on each database under test.
"""
