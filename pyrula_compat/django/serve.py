"""What ``pyrula worker --workflow pyrula_compat.django.serve`` serves: every
``django.tasks`` task of the Django project (``DJANGO_SETTINGS_MODULE``).

Importing this module sets Django up and imports the ``tasks`` module of every installed
app (as Django projects lay their tasks out), whose ``@task`` functions register their
workflows; list more modules in ``PYRULA_DJANGO_TASK_MODULES`` (comma-separated).
"""

from __future__ import annotations

import os
from importlib import import_module
from importlib.util import find_spec


def _load() -> None:
    import django
    from django.apps import apps

    django.setup()
    modules = [f"{config.name}.tasks" for config in apps.get_app_configs()]
    modules += [m.strip() for m in os.environ.get("PYRULA_DJANGO_TASK_MODULES", "").split(",")]
    for name in modules:
        if name and find_spec(name.rsplit(".", 1)[0]) is not None:
            try:
                found = find_spec(name)
            except ModuleNotFoundError:
                found = None
            if found is not None:
                import_module(name)


_load()
