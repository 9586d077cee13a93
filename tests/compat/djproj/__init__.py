"""A Django project whose Celery app is set up the way Celery's Django guide does it."""

from .celery import app as celery_app

__all__ = ("celery_app",)
