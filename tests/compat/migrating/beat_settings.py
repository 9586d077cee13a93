"""The Django settings of the migrating project: django-celery-beat's tables in a SQLite
file (``MIGRATE_DB``), or on Postgres (``MIGRATE_PG_DSN``). django_celery_beat is an
installed app only where it can be imported (the old deployment's processes): it needs
Celery, which the project's venv does not have, and ``pyrula migrate beat`` reads its
tables with SQL, not its models."""

import os
from importlib.util import find_spec

SECRET_KEY = "migrating"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_celery_beat"] if find_spec("django_celery_beat") else []
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["MIGRATE_DB"]}}
if os.environ.get("MIGRATE_PG_DSN"):  # the same tables on Postgres (a schema of the test's)
    from psycopg.conninfo import conninfo_to_dict

    _pg = conninfo_to_dict(os.environ["MIGRATE_PG_DSN"])
    DATABASES["default"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _pg.get("dbname"),
        "USER": _pg.get("user", ""),
        "PASSWORD": _pg.get("password", ""),
        "HOST": _pg.get("host", ""),
        "PORT": _pg.get("port", ""),
        "OPTIONS": {"options": _pg.get("options", "")},
    }
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
