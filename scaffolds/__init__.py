"""Templates for ``pyrula init`` (``plain/``) and ``pyrula init --celery`` (``celery/``).

This folder installs as the package ``pyrula.scaffolds`` (see setup.py); its templates
are package data, read with :mod:`importlib.resources` by :mod:`pyrula.cli.init`.
"""
