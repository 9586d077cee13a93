"""A Celery-shaped sample project, laid out as real projects lay it out, on pyrula_compat."""

from .celery import app as celery_app

__all__ = ("celery_app",)
