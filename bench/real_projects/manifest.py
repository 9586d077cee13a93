"""The public Celery projects whose own test suites `run.py` runs, each at a pinned commit.

Nothing of these projects is kept in this repository: `run.py` checks each one out at
``commit`` into a temporary directory (from ``mirror``, a local bare git directory, when
it exists, else by ``git clone`` of ``url``), installs ``requirements`` into a venv of its
own, and runs ``test`` there, once against Celery 5.7 and once against this pyrula checkout
with the project's imports rewritten to ``pyrula_compat``.

Placeholders in ``env``, ``worker`` and ``substitutions``: ``{valkey_url}`` (a throw-away
``valkey-server`` on 127.0.0.1, started when ``valkey`` is true) and ``{python}`` (the
venv's interpreter).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIRRORS = "/work/.mirror"

CELERY_REQUIREMENT = "celery[redis]==5.7.0"
KOMBU = "kombu==5.7.0"  # the kombu of Celery 5.7


@dataclass(frozen=True)
class Worker:
    """A worker process the suite needs beside it (a tutorial app's ``celery worker``)."""

    app: str  # the -A argument, as the project's docs give it
    celery: tuple[str, ...] = ("--pool", "solo", "-l", "info")  # after `celery -A APP worker`
    shim: tuple[str, ...] = ("-l", "info")  # after `pyrula worker -A APP`


@dataclass(frozen=True)
class Project:
    name: str
    url: str
    commit: str
    requirements: tuple[str, ...]
    # pytest arguments (the runner adds --junitxml and -p no:cacheprovider); or, with
    # django_runner set, the test labels of Django's test runner.
    test: tuple[str, ...]
    what: str  # one line: what the project is
    mirror: str | None = None  # a bare git dir under MIRRORS
    workdir: str = "."  # where the tests run, inside the checkout
    env: dict[str, str] = field(default_factory=dict)
    valkey: bool = False
    worker: Worker | None = None
    # Requirements of the Celery run only: packages that depend on Celery itself. In the
    # shim run each is replaced by what `shim_pytest_plugins` loads.
    celery_only: tuple[str, ...] = ()
    # pytest plugins that a `celery_only` package registers through its entry point
    # (pytest-celery 0.0.0 registers celery.contrib.pytest): loaded with -p in the shim run.
    shim_pytest_plugins: tuple[str, ...] = ()
    # Packages Celery brings in that the project imports itself (``from kombu.utils.uuid
    # import uuid``): installed in the shim run too, as the project would keep them once
    # Celery is gone. None of them imports Celery (the runner checks ``import celery`` fails).
    shim_keeps: tuple[str, ...] = ()
    # (file, old, new): exact text replacements made in both runs, for a URL the project
    # hard-codes (its CI has a Redis on localhost:6379; here the server is on a free port).
    substitutions: tuple[tuple[str, str, str], ...] = ()
    # Django's test runner (dotted path) instead of pytest, with these settings.
    django_runner: str | None = None
    django_settings: str | None = None


PYTEST = "pytest>=8,<9"

PROJECTS: tuple[Project, ...] = (
    Project(
        name="celery-singleton",
        url="https://github.com/steinitzu/celery-singleton",
        mirror="steinitzu+celery-singleton/repo",
        commit="4ee161853d82f71d4565be2bd7d81fc6d8bcbded",
        what="a Task base (Singleton) that refuses duplicates with a Redis lock",
        requirements=(PYTEST, "redis>=4"),
        celery_only=("pytest-celery==0.0.0",),
        shim_pytest_plugins=("pyrula_compat.contrib.pytest",),
        valkey=True,
        env={"CELERY_SINGLETON_TEST_REDIS_URL": "{valkey_url}/0"},
        shim_keeps=(KOMBU,),
        test=("tests", "-o", "addopts="),  # its addopts are coverage options
    ),
    Project(
        name="celery-once",
        url="https://github.com/cameronmaske/celery-once",
        mirror="cameronmaske+celery-once/repo",
        commit="4f68b6b3c8503b9360179a246521b07315cdf577",
        what="a Task base (QueueOnce) that refuses a task already queued; Redis and file locks",
        requirements=(PYTEST, "pytest-mock", "fakeredis>=2", "redis>=4", "mock", "Flask", "six"),
        test=("tests",),
    ),
    Project(
        name="flask-celeryext",
        url="https://github.com/inveniosoftware/flask-celeryext",
        mirror="inveniosoftware+flask-celeryext/repo",
        commit="8fb596d9b38e2824bda222d51384f34d5414b659",
        what="Flask integration: create_celery_app, AppContextTask, RequestContextTask",
        requirements=(
            PYTEST,
            "Flask>=2.2,<4",
            "pytest-flask",
            "pytest-mock",
            "redis>=4",
            "msgpack",
        ),
        # its addopts add black, isort, pydocstyle and coverage plugins: not the suite
        test=("tests", "-o", "addopts="),
    ),
    Project(
        name="django-celery-email",
        url="https://github.com/pmclanahan/django-celery-email",
        mirror="pmclanahan+django-celery-email/repo",
        commit="d47da19c09e29eea90684692e8dfa059e026c046",
        what="a Django email backend that sends mail from a Celery task",
        requirements=("Django>=4.2,<6", "django-appconf"),
        django_runner="tests.DJCETestSuiteRunner",
        django_settings="tests.settings",
        test=("tests",),
    ),
    Project(
        name="django-structlog",
        url="https://github.com/jrobichaud/django-structlog",
        mirror="jrobichaud+django-structlog/repo",
        commit="d82f525191a3bd202a019c6e7d3392cde6009e75",
        what="a Django logging library: structlog context for requests and Celery tasks",
        requirements=(
            PYTEST,
            "pytest-django",
            "Django>=4.2,<6",
            "structlog>=21.4",
            "django-environ",
            "django-extensions",
            "colorama",
            "factory-boy",
            "django-ipware>=6",
            "asgiref",
            "redis>=4",
        ),
        valkey=True,
        env={
            "DJANGO_SETTINGS_MODULE": "config.settings.test",
            "CELERY_BROKER_URL": "{valkey_url}/0",
            "CELERY_RESULT_BACKEND": "{valkey_url}/0",
        },
        test=("test_app", "-o", "addopts="),
    ),
    Project(
        name="celery-heimdall",
        url="https://github.com/TkTech/celery-heimdall",
        mirror="TkTech+celery-heimdall/repo",
        commit="d7e41a959bb9f82bdad2d329fd09b084a6df2996",
        what="Task bases for unique and rate-limited tasks, on Redis; celery.contrib.pytest worker",
        requirements=(PYTEST, "redis>=4"),
        valkey=True,
        substitutions=(("tests/conftest.py", '"redis://"', '"{valkey_url}/0"'),),
        shim_keeps=(KOMBU,),
        test=("tests",),
    ),
    Project(
        name="celery-batches",
        url="https://github.com/clokep/celery-batches",
        mirror="clokep+celery-batches/repo",
        commit="da711e6a2ce53e22fdda8e28ddc97064e0756221",
        what="a Task base (Batches) that runs queued calls in batches; memory broker worker",
        requirements=(PYTEST, "pytest-timeout"),
        celery_only=("pytest-celery==0.0.0",),
        shim_pytest_plugins=("pyrula_compat.contrib.pytest",),
        shim_keeps=(KOMBU,),
        test=("t", "--timeout=120"),
    ),
    Project(
        name="django-celery-outbox",
        url="https://github.com/Barsoomx/django-celery-outbox",
        mirror="Barsoomx+django-celery-outbox/repo",
        commit="f05c76bc72f2ca58ce12d66bc63cb5b1aeae2c70",
        what="the transactional outbox pattern for Celery tasks in Django",
        requirements=(
            PYTEST,
            "pytest-django",
            "factory-boy",
            "Django>=4.2,<6",
            "structlog>=21.4",
            "sentry-sdk>=2",
            "datadog>=0.44",
        ),
        test=(),
    ),
    Project(
        name="fastapi-celery",
        url="https://github.com/testdrivenio/fastapi-celery",
        mirror="testdrivenio+fastapi-celery/repo",
        commit="191ff138701777838c363772253f73a276c16d68",
        what="TestDriven.io's FastAPI + Celery course app: a worker, Redis, a polling status test",
        workdir="project",
        # the versions of its requirements.txt: newer Starlette changed TemplateResponse
        requirements=(
            PYTEST,
            "fastapi==0.95.0",
            "httpx==0.23.3",
            "Jinja2==3.1.2",
            "aiofiles==23.1.0",
            "redis>=4",
        ),
        valkey=True,
        env={"CELERY_BROKER_URL": "{valkey_url}/0", "CELERY_RESULT_BACKEND": "{valkey_url}/0"},
        worker=Worker(app="worker.celery"),
        test=("tests",),
    ),
    Project(
        name="flask-celery",
        url="https://github.com/testdrivenio/flask-celery",
        mirror="testdrivenio+flask-celery/repo",
        commit="5c66be55b203d5a5f0522c5f535f8af121ee753c",
        what="TestDriven.io's Flask + Celery tutorial app: a worker, Redis, a polling status test",
        requirements=(PYTEST, "Flask>=2.2,<4", "Flask-WTF", "redis>=4"),
        valkey=True,
        env={
            "CELERY_BROKER_URL": "{valkey_url}/0",
            "CELERY_RESULT_BACKEND": "{valkey_url}/0",
            "APP_SETTINGS": "project.server.config.TestingConfig",
        },
        worker=Worker(app="project.server.tasks.celery"),
        test=("project/tests",),
    ),
    Project(
        name="django-celery",
        url="https://github.com/testdrivenio/django-celery",
        mirror="testdrivenio+django-celery/repo",
        commit="60d56b9a2e4d48341cde3dcdd6e51c08867ae688",
        what="TestDriven.io's Django + Celery tutorial app: a worker, Redis, a polling status test",
        workdir="project",
        requirements=(PYTEST, "pytest-django", "Django>=4.2,<6", "redis>=4"),
        valkey=True,
        # the environment of its docker-compose.yml
        env={
            "CELERY_BROKER": "{valkey_url}/0",
            "DEBUG": "1",
            "SECRET_KEY": "dbaa1_i7%*3r9-=z-+_mz4r-!qeed@(-a_r(g@k8jo8y3r27%m",
            "DJANGO_ALLOWED_HOSTS": "localhost 127.0.0.1 [::1] testserver",
        },
        worker=Worker(app="core"),
        test=("tests",),
    ),
)


def by_name(name: str) -> Project:
    for project in PROJECTS:
        if project.name == name:
            return project
    known = ", ".join(p.name for p in PROJECTS)
    raise KeyError(f"no project {name!r} in the manifest; known: {known}")
