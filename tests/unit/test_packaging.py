"""The wheel's layout: the templates of ``pyrula init`` install inside the package, as
``pyrula.scaffolds``, and nothing but pyrula's own packages lands at the top level of
site-packages. Built from this tree with pip, then installed into a fresh directory."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("pyrula-*.whl")
    return built


@pytest.mark.slow
def test_wheel_has_no_top_level_scaffolds(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"pyrula", "pyrula_compat"}
    assert "pyrula/scaffolds/celery/proj/tasks.py" in names
    assert "pyrula/scaffolds/plain/app.py" in names


@pytest.mark.slow
def test_init_writes_templates_from_an_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    project = tmp_path / "proj"
    # -I: neither the working directory nor PYTHONPATH, so only the installed copy imports.
    code = (
        f"import sys; sys.path[:0] = [{str(site)!r}]; "
        "from pyrula.cli.main import main; sys.argv = ['pyrula', 'init', '--celery', "
        f"{str(project)!r}]; main()"
    )
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (project / "proj" / "celery.py").is_file()
    assert (project / "app.py").is_file()
