"""The Django settings of the migrating project: django-celery-beat's tables in a SQLite
file (``MIGRATE_DB``). django_celery_beat is an installed app only where it can be
imported (the old deployment's processes): it needs Celery, which the project's venv does
not have, and ``pyrula migrate beat`` reads its tables with SQL, not its models."""

import os
from importlib.util import find_spec

SECRET_KEY = "migrating"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_celery_beat"] if find_spec("django_celery_beat") else []
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["MIGRATE_DB"]}}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
