"""``celery.contrib``: the Django task class and the test worker."""
