# Two-factor sign-in: an owner may require it of every member (accounts/otp.py).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0005_invitation"),
    ]

    operations = [
        migrations.AddField(
            model_name="project",
            name="require_two_factor",
            field=models.BooleanField(db_default=False, default=False),
        ),
    ]
