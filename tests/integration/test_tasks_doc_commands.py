"""docs/tasks.md, "Adding Leasecast to a Django project": its commands, twice in a row.

tests/integration/test_host_project.py builds the project the section
describes (``startproject mysite`` plus the section's blocks) and serves it
once. Here the same project is built once, then the commands the section
names in its text (inline, not in ``sh`` blocks) are typed into a shell in
the project's directory, twice in a row on the same SQLite database, as a
developer coming back to it would:

- ``python manage.py migrate`` (the second time: nothing to apply);
- ``python manage.py issue_token NAME --scope 'consume:orders.*' ...``, with
  ``NAME`` a name and the ``...`` (more scopes) left out;
- ``daphne mysite.asgi:application`` and ``python -m gateway.serve
  mysite.asgi:application``, each in the background, given ``-b 127.0.0.1
  -p PORT`` (a free port for daphne's default 8000), then stopped.

``python`` is the environment's (``.venv/bin`` first on ``PATH``, as an
activated virtualenv); no ``PYTHONPATH`` or ``DJANGO_SETTINGS_MODULE``: the
project's ``manage.py`` and ``asgi.py`` set what they need.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.doc_shell import Shell, in_background
from tests.integration.test_host_project import DOC, host_env, make_project
from tests.support.clients import http
from tests.support.databases import ROOT
from tests.support.gateways import free_port
from tests.support.waiting import wait_until_blocking

SECTION = "## Adding Leasecast to a Django project"


def inline_commands() -> list[str]:
    """The inline code spans of the section's prose, whitespace (a line break inside
    one) made single."""
    text = DOC.read_text()
    start = text.index(SECTION + "\n")
    end = text.index("\n## ", start + len(SECTION))
    prose = re.sub(r"```.*?```", "", text[start:end], flags=re.DOTALL)  # code blocks out
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]


def the(commands: list[str], prefix: str) -> str:
    [found] = [c for c in commands if c.startswith(prefix)]
    return found


def status_of(url: str) -> int | None:
    """``GET url``: its status, or None while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@pytest.mark.slow  # weighs more in the parallel stage's order (tests/conftest.py)
def test_the_project_set_up_commands_run_twice(tmp_path: Path) -> None:
    commands = inline_commands()
    migrate = the(commands, "python manage.py migrate")
    issue = the(commands, "python manage.py issue_token NAME")
    daphne = the(commands, "daphne mysite.asgi:application")
    serve = the(commands, "python -m gateway.serve mysite.asgi:application")
    assert (migrate, daphne, serve) == (
        "python manage.py migrate",
        "daphne mysite.asgi:application",
        "python -m gateway.serve mysite.asgi:application",
    )
    # NAME is the token's name; "..." stands for more scopes (none here).
    issue = issue.replace("NAME", "orders-worker").removesuffix(" ...")
    assert issue == "python manage.py issue_token orders-worker --scope 'consume:orders.*'"

    where = Path(tempfile.mkdtemp(prefix="leasecast-tasks-doc-"))
    try:
        project = make_project(where)
        env = host_env(project, debug=False, database_url=None)
        del env["PYTHONPATH"], env["DJANGO_SETTINGS_MODULE"]
        env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}"
        for round_ in (1, 2):
            shell = Shell(env, tmp_path / f"project{round_}.log", cwd=project)
            try:
                migrated = shell.run(migrate)
                if round_ == 1:
                    assert "Applying gateway.0001_initial... OK" in migrated, migrated
                else:
                    assert "No migrations to apply." in migrated, migrated
                token = shell.run(issue).strip().splitlines()[-1]
                assert token.startswith("lc_"), token
                for server in (daphne, serve):
                    port = free_port()
                    shell.run(in_background(f"{server} -b 127.0.0.1 -p {port}"))
                    health = f"http://127.0.0.1:{port}/healthz"
                    wait_until_blocking(lambda: status_of(health) == 200, f"{server} on {port}")  # noqa: B023
                    # The view enqueues in its transaction (a duplicate key the second time).
                    status, placed = http("POST", f"http://127.0.0.1:{port}/place/", body={})
                    assert status == 201 and placed["message"], (status, placed, shell.text())
                    # The admin's styles: the asgi.py's static files handler, DEBUG off.
                    css = status_of(f"http://127.0.0.1:{port}/static/admin/css/base.css")
                    assert css == 200, (css, shell.text())
                    stopped = shell.run('kill $! && wait $!; echo "exited $?"')
                    assert "exited 0" in stopped, stopped
            finally:
                shell.close()
    finally:
        shutil.rmtree(where, ignore_errors=True)
