# Load the Celery app when Django starts, so @shared_task uses it. A process a test starts
# (RESOURCE_LEASE_TEST_CHILD, tests/conftest.py's worker_env) sends no task unless it imports
# project.celery itself (the Celery tests' tasks and workers do): it starts without Celery,
# some 0.2 s of CPU less, and starting such children is most of what a full test run spends
# its two cores on. ``project.celery_app`` still answers there, loaded when first asked for.
import os

if not os.environ.get("RESOURCE_LEASE_TEST_CHILD"):
    from project.celery import app as celery_app
else:

    def __getattr__(name: str) -> object:
        if name == "celery_app":
            from project.celery import app

            return app
        raise AttributeError(f"module 'project' has no attribute {name!r}")


__all__ = ["celery_app"]
