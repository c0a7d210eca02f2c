"""Topic setting ``presence`` (protocol 1.2: Presence)."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("gateway", "0009_schedules")]

    operations = [
        migrations.AddField(
            model_name="topic",
            name="presence",
            field=models.BooleanField(
                default=False,
                help_text=(
                    "Its subscribers are listed by GET .../presence and told of joins and leaves."
                ),
            ),
        ),
    ]
