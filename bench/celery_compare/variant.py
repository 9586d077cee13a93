"""``python -m celery_compare.variant DIRS TARGET [ARGS...]``: run ``TARGET`` with the
``pyrula`` and ``pyrula_compat`` packages imported from ``DIRS`` (``os.pathsep``-separated,
first match wins) instead of the installed ones.

The driver uses it to run every pyrula process of one comparison on a snapshot of the
code taken when it started (other work on the tree must not change the code between
segments), and for A/B runs of the shim in the same rounds (``--variant NAME=DIR``, e.g.
the last commit's shim: ``git archive HEAD pyrula_compat | tar -x -C DIR``). ``TARGET``
is ``pyrula`` (the CLI) or a module to run as ``python -m`` would. The editable install's
import hook would otherwise win over ``PYTHONPATH``, so each package is loaded from its
directory before anything imports it; its submodules follow its ``__path__``.
"""

import importlib.machinery
import importlib.util
import os
import runpy
import sys

PACKAGES = ("pyrula", "pyrula_compat")


def use_packages_from(directories: list[str]) -> None:
    for package in PACKAGES:
        spec = importlib.machinery.PathFinder.find_spec(package, directories)
        if spec is None or spec.loader is None:
            continue  # the installed one
        module = importlib.util.module_from_spec(spec)
        sys.modules[package] = module
        spec.loader.exec_module(module)


def main() -> None:
    directories, target, *rest = sys.argv[1:]
    use_packages_from([d for d in directories.split(os.pathsep) if d])
    sys.argv = [target, *rest]
    if target == "pyrula":
        from pyrula.cli.main import main as cli

        sys.exit(cli())
    runpy.run_module(target, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
