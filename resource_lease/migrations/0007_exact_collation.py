# Kinds and names compare exactly on MySQL/MariaDB too (case, trailing spaces): see
# resource_lease/db/collation.py. A no-op on PostgreSQL and SQLite.

from django.db import migrations

from resource_lease.db.collation import ExactCollation


class Migration(migrations.Migration):

    dependencies = [
        ('resource_lease', '0006_locks_admin_and_event_kind'),
    ]

    operations = [
        ExactCollation('resource', ['kind', 'name']),
        ExactCollation('leaseevent', ['kind', 'name']),
    ]
