"""pyrula as a backend of Django's task framework (``django.tasks``, Django 6; the
``django_tasks`` backport on older Django)::

    TASKS = {"default": {"BACKEND": "pyrula_compat.django.PyrulaTaskBackend",
                         "OPTIONS": {"store": "redis://localhost:6379/0"}}}

Each enqueued task is a durable run (:mod:`.backend`); ``pyrula worker --workflow
pyrula_compat.django.serve`` serves them (:mod:`.serve`).
"""

from pyrula_compat.django.backend import PyrulaTaskBackend

__all__ = ["PyrulaTaskBackend"]
