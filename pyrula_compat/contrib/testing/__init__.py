"""``celery.contrib.testing``: an in-process worker for tests and scripts."""
