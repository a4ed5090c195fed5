# Load the Celery app when Django starts, so @shared_task uses it.
from project.celery import app as celery_app

__all__ = ["celery_app"]
