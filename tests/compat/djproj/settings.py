import os

SECRET_KEY = "test-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "shop"]
ROOT_URLCONF = "djproj.urls"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DJPROJ_DB", ":memory:"),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

CELERY_BROKER_URL = os.environ.get("DJPROJ_BROKER", "sqlite:///djproj.db")
CELERY_RESULT_BACKEND = "django-db"  # django-celery-results: tolerated, results stay in the store
CELERY_TASK_SERIALIZER = "json"
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
