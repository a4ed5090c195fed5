"""The JSON fields write floats from 1e16 up in full (``db.json_text.ExactEncoder``), so that
PostgreSQL's jsonb reads them back as floats. The encoder is Python's side only: no column
changes, so the state alone is altered (SQLite would otherwise copy each table, and with it
drop what earlier migrations built by hand)."""

import resource_lease.db.json_text
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("resource_lease", "0014_resource_line_until"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.AlterField(
                    model_name="configentry",
                    name="default",
                    field=models.JSONField(
                        blank=True,
                        encoder=resource_lease.db.json_text.ExactEncoder,
                        help_text="The default declared by the code.",
                        null=True,
                    ),
                ),
                migrations.AlterField(
                    model_name="configentry",
                    name="value",
                    field=models.JSONField(
                        blank=True,
                        encoder=resource_lease.db.json_text.ExactEncoder,
                        help_text="The stored value; empty: the default applies.",
                        null=True,
                    ),
                ),
                migrations.AlterField(
                    model_name="dispenseritem",
                    name="payload",
                    field=models.JSONField(blank=True, encoder=resource_lease.db.json_text.ExactEncoder, null=True),
                ),
                migrations.AlterField(
                    model_name="dispenseritem",
                    name="result",
                    field=models.JSONField(blank=True, encoder=resource_lease.db.json_text.ExactEncoder, null=True),
                ),
                migrations.AlterField(
                    model_name="resource",
                    name="data",
                    field=models.JSONField(
                        blank=True,
                        default=dict,
                        encoder=resource_lease.db.json_text.ExactEncoder,
                        help_text="What the resource is (e.g. a proxy URL).",
                    ),
                ),
                migrations.AlterField(
                    model_name="topic",
                    name="payload",
                    field=models.JSONField(
                        blank=True,
                        encoder=resource_lease.db.json_text.ExactEncoder,
                        help_text="The last notification's payload.",
                        null=True,
                    ),
                ),
            ],
        ),
    ]
