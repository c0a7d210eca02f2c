# Schedules (protocol 1.2: Schedules): one row per schedule, fired by every
# gateway process (gateway.engine.schedules) with a compare-and-set on
# last_tick in the enqueue's transaction.

from django.db import migrations, models

import gateway.models


class Migration(migrations.Migration):
    dependencies = [
        ("gateway", "0008_queue_control"),
    ]

    operations = [
        migrations.CreateModel(
            name="Schedule",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=200, unique=True)),
                (
                    "queue",
                    models.CharField(help_text="The queue each tick enqueues to.", max_length=200),
                ),
                (
                    "body",
                    models.TextField(default="null", help_text="The message body as JSON text."),
                ),
                (
                    "cron",
                    models.CharField(
                        blank=True,
                        help_text="Five fields: minute, hour, day of month, month, day of week.",
                        max_length=200,
                        null=True,
                    ),
                ),
                (
                    "every",
                    models.FloatField(
                        blank=True,
                        help_text="Seconds between ticks (>= 1), aligned on the epoch.",
                        null=True,
                    ),
                ),
                (
                    "timezone",
                    models.CharField(
                        default="UTC",
                        help_text="IANA timezone of the cron expression.",
                        max_length=64,
                    ),
                ),
                ("enabled", models.BooleanField(default=True)),
                ("group", models.CharField(blank=True, max_length=200, null=True)),
                ("priority", models.SmallIntegerField(default=0)),
                ("ttl", models.FloatField(blank=True, null=True)),
                ("last_tick", models.FloatField(blank=True, editable=False, null=True)),
                ("fired", models.BigIntegerField(default=0, editable=False)),
                (
                    "active_since",
                    models.FloatField(default=gateway.models._now, editable=False),
                ),
                ("managed", models.BooleanField(default=False, editable=False)),
                (
                    "task_backend",
                    models.CharField(blank=True, editable=False, max_length=100, null=True),
                ),
                ("created_at", models.FloatField(default=gateway.models._now, editable=False)),
                ("updated_at", models.FloatField(default=gateway.models._now, editable=False)),
            ],
            options={"db_table": "leasecast_schedule", "ordering": ["name"]},
        ),
    ]
