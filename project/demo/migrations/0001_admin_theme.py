"""Install the demo's admin theme (``project/demo/theme.py``), so a fresh clone shows the
themed admin after ``migrate`` without a manual step. Editable afterwards in the admin."""

from __future__ import annotations

from typing import Any

from django.db import migrations

from project.demo.theme import THEME, install


def create_theme(apps: Any, schema_editor: Any) -> None:
    install(apps.get_model("admin_interface", "Theme"), schema_editor.connection.alias)


def remove_theme(apps: Any, schema_editor: Any) -> None:
    theme_model = apps.get_model("admin_interface", "Theme")
    theme_model.objects.using(schema_editor.connection.alias).filter(name=THEME).delete()


class Migration(migrations.Migration):
    dependencies = [("admin_interface", "0032_alter_theme_defaults")]

    operations = [migrations.RunPython(create_theme, remove_theme)]
