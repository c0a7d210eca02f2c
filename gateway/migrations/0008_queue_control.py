# Queue control (protocol 1.2: Pause, Concurrency and rate limits), when a
# message's lease began (the lease-length histogram) and the dead-letter reason
# "cancelled". Database defaults let raw INSERTs that do not
# name the new columns (gateway.store) keep working.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("gateway", "0007_transaction_owner"),
    ]

    operations = [
        migrations.AddField(
            model_name="queue",
            name="max_in_flight",
            field=models.PositiveIntegerField(
                db_default=0,
                default=0,
                help_text="Most messages leased at once, over every process; 0 is unlimited.",
            ),
        ),
        migrations.AddField(
            model_name="queue",
            name="paused",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="A paused queue accepts enqueues, acks and nacks but leases nothing.",
            ),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_burst",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Bucket size (most leases at once); empty is max(1, ceil(rate_limit)).",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_limit",
            field=models.FloatField(
                db_default=0.0,
                default=0.0,
                help_text="Leases per second over every process (token bucket); 0 is none.",
            ),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_refilled_at",
            field=models.FloatField(db_default=0.0, default=0.0, editable=False),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_tokens",
            field=models.FloatField(db_default=0.0, default=0.0, editable=False),
        ),
        migrations.AddField(
            model_name="message",
            name="leased_at",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="message",
            name="dead_reason",
            field=models.CharField(
                blank=True,
                choices=[
                    ("max_deliveries", "max_deliveries"),
                    ("rejected", "rejected"),
                    ("expired", "expired"),
                    ("overflow", "overflow"),
                    ("cancelled", "cancelled"),
                ],
                max_length=16,
                null=True,
            ),
        ),
    ]
