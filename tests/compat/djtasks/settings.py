"""Settings of the ``djtasks`` project: one app (``shop``), a SQLite database, and
Django's task framework on pyrula (``DJTASKS_STORE``, a pyrula store URL)."""

import os

SECRET_KEY = "djtasks"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["pyrula_compat.django", "tests.compat.djtasks.shop"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["DJTASKS_DB"]}}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
TASKS = {
    "default": {
        "BACKEND": "pyrula_compat.django.PyrulaTaskBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"store": os.environ["DJTASKS_STORE"]},
    }
}
