# Transactions are bound to their first stager (protocol 1.2: General).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("gateway", "0006_queue_counters"),
    ]

    operations = [
        migrations.AddField(
            model_name="transaction",
            name="owner",
            field=models.CharField(blank=True, max_length=300, null=True),
        ),
        migrations.AlterField(
            model_name="transaction",
            name="state",
            field=models.CharField(
                choices=[("open", "open"), ("committed", "committed"), ("aborted", "aborted")],
                max_length=10,
            ),
        ),
    ]
