"""The Django app of pyrula's task backend (``"pyrula_compat.django"`` in
INSTALLED_APPS): it brings the ``pyrula_worker`` management command."""

from django.apps import AppConfig


class PyrulaTasksConfig(AppConfig):  # type: ignore[misc]
    name = "pyrula_compat.django"
    label = "pyrula_tasks"
    verbose_name = "pyrula tasks"
