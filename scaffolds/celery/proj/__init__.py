"""The project package; importing it loads the app, as in a Celery project."""

from .celery import app as celery_app

__all__ = ("celery_app",)
