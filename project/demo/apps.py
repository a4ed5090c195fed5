from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo project's own app: the main job's commands (``manage.py demo`` ...)."""

    name = "project.demo"
    label = "demo"
    default_auto_field = "django.db.models.BigAutoField"
