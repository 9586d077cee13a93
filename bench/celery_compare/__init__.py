"""Celery 5, Dramatiq and pyrula_compat side by side on one valkey-server.

``python bench/celery_compare --help``; see ``bench/README.md`` and the section "Celery
and Dramatiq side by side" of ``docs/performance.md``. Imported with ``bench/`` on
``sys.path`` (the driver puts it there for every process it starts).
"""
