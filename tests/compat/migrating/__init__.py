"""A project in the middle of a move from Celery to pyrula, and real Celery 5.7 for it.

``tasks`` runs under real Celery (a process with Celery on its path: the old
deployment) and under ``pyrula_compat`` (the new one), importing whichever it finds.
"""
