"""Package layout that pyproject.toml cannot spell: the repository's top-level
``scaffolds/`` folder (the templates of ``pyrula init``) installs as ``pyrula.scaffolds``,
inside the package, so no generic top-level ``scaffolds`` lands in site-packages."""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["pyrula", "pyrula.*", "pyrula_compat", "pyrula_compat.*"]),
        "pyrula.scaffolds",
    ],
    package_dir={"pyrula.scaffolds": "scaffolds"},
)
