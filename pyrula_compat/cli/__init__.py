"""The drop-in's commands on the ``pyrula`` CLI, registered through the ``pyrula.cli``
entry-point group (pyproject.toml), as Celery's own commands load through
``celery.commands``: pyrula's CLI lists them and imports one only when it runs."""
