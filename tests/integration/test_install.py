"""Installing the gateway into an existing project: what pip resolves, for real.

Each test asks pip (``install --dry-run --report``, nothing installed) to
install the Python client and the gateway from this checkout beside the
Django a project already uses, and reads what pip would install: the
project's Django must stay as it is (never downgraded), and the
``django-tasks`` package comes only where Django has no ``django.tasks``
(Django 5.2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.databases import ROOT

#: The current Django release, which the gateway must accept.
CURRENT_DJANGO = "6.1"


def python312() -> str | None:
    """A Python 3.12 or later (Django 6 needs it), as ``make test-django6`` finds one."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [os.environ.get("PYTHON_DJANGO6", "python3.12")]
    candidates += sorted(str(p) for p in pyenv.glob("3.1[2-9]*/bin/python3"))
    for candidate in candidates:
        try:
            done = subprocess.run(
                [candidate, "-c", "import sys; assert sys.version_info >= (3, 12)"],
                capture_output=True,
                timeout=30,
            )
        except OSError:
            continue
        if done.returncode == 0:
            return candidate
    return None


def resolve(python: str, *requirements: str, tmp_path: Path) -> dict[str, str]:
    """What pip on ``python`` would install for the client, the gateway and
    ``requirements``: distribution name (lower case) to version."""
    report = tmp_path / "report.json"
    done = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            str(ROOT / "clients" / "python"),
            *requirements,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installs}


def test_the_current_django_release_is_kept_and_needs_no_django_tasks(tmp_path: Path) -> None:
    python = python312()
    if python is None:
        pytest.skip("no Python 3.12 or later on this machine: Django 6 cannot be installed")
    got = resolve(python, str(ROOT), f"django=={CURRENT_DJANGO}.*", tmp_path=tmp_path)
    assert got["django"].startswith(CURRENT_DJANGO + "."), got["django"]
    assert "leasecast-gateway" in got
    assert "django-tasks" not in got


def test_django_5_2_on_python_3_11_gets_django_tasks(tmp_path: Path) -> None:
    if sys.version_info >= (3, 12):
        pytest.skip("this Python is 3.12 or later; the test is about Python 3.11")
    got = resolve(sys.executable, str(ROOT), "django>=5.2,<6", tmp_path=tmp_path)
    assert got["django"].startswith("5.2."), got["django"]
    assert "django-tasks" in got


def test_django_5_2_on_python_3_12_gets_django_tasks_through_the_extra(tmp_path: Path) -> None:
    python = python312()
    if python is None:
        pytest.skip("no Python 3.12 or later on this machine")
    got = resolve(python, f"{ROOT}[django52]", "django>=5.2,<6", tmp_path=tmp_path)
    assert got["django"].startswith("5.2."), got["django"]
    assert "django-tasks" in got
