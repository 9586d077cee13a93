import os

from pyrula_compat import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproj.settings")

app = Celery("djproj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
