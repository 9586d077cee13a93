"""Django's task framework, wherever it comes from: ``django.tasks`` (Django 6) or the
``django_tasks`` backport (the same API on older Django)."""

from __future__ import annotations

try:
    from django.tasks import DEFAULT_TASK_QUEUE_NAME, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist

    SOURCE = "django.tasks"
except ImportError:  # Django before 6: the backport, if installed
    try:
        from django_tasks import (
            DEFAULT_TASK_QUEUE_NAME,
            task_backends,
        )
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import (
            Task,
            TaskContext,
            TaskError,
            TaskResult,
            TaskResultStatus,
        )
        from django_tasks.exceptions import (
            InvalidTaskError as InvalidTask,
        )
        from django_tasks.exceptions import (
            TaskResultDoesNotExist,
        )
    except ImportError as exc:
        raise ImportError(
            "pyrula_compat.django needs Django's task framework: Django 6 (django.tasks) or, "
            "on older Django, the django-tasks backport (pip install django-tasks)"
        ) from exc
    SOURCE = "django_tasks"

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "SOURCE",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "task_backends",
]
