"""Leasecast in a brand-new Django project, set up as docs/tasks.md says, under real daphne.

Each run makes a project with ``django-admin startproject mysite``, adds to its
``settings.py`` and writes its ``asgi.py`` from the blocks of docs/tasks.md
("A complete project": copied out of the document, so the document and this
test cannot drift), adds a view that enqueues a message and a task inside
``transaction.atomic()``, migrates, and serves it with daphne
(``python -m gateway.serve``). It runs with ``DEBUG`` on (what startproject
writes; Django's debug cursor formats every statement with ``%`` to log it)
and off (static files are no longer served by ``runserver``'s magic), on
SQLite and on PostgreSQL.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.cookiejar import CookieJar
from pathlib import Path

import pytest

from tests.support.clients import http
from tests.support.databases import PG_ADMIN_URL, ROOT, postgres_unavailable
from tests.support.gateways import DAPHNE, GatewayProcess

DOC = ROOT / "docs" / "tasks.md"
PASSWORD = "a-long-operator-password-1"

# The project's own code, beside what the document tells a project to add.
VIEWS = '''
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

import gateway
from mysite.tasks import remember


@csrf_exempt
def place(request: HttpRequest) -> JsonResponse:
    """A message and a task, in the view's transaction."""
    with transaction.atomic():
        sent = gateway.enqueue("host.orders", {"order": 1}, key="order-1")
        result = remember.enqueue(7)
    return JsonResponse({"message": sent.id, "task": result.id}, status=201)
'''

TASKS = """
try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task  # Django 5.2: the django-tasks package


@task()
def remember(n: int) -> int:
    return n
"""

URLS = """
from django.contrib import admin
from django.urls import include, path

from mysite import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("place/", views.place),
    path("", include("gateway.api_urls")),
]
"""

# What this test sets that a real project would set its own way.
TEST_SETTINGS = """
import dj_database_url as _dj_database_url

DEBUG = os.environ["HOST_DEBUG"] == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": _dj_database_url.config(conn_max_age=0)}
"""


def doc_block(first_line: str) -> str:
    """The fenced Python block of docs/tasks.md whose first line starts ``first_line``."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    found = [block for block in blocks if block.startswith(first_line)]
    assert len(found) == 1, f"docs/tasks.md must have one block starting {first_line!r}"
    return found[0]


class HostProcess(GatewayProcess):
    """daphne (with Leasecast's defaults) serving ``mysite.asgi:application``."""

    def command(self) -> list[str]:
        return [*DAPHNE, "-b", "127.0.0.1", "-p", str(self.port), "mysite.asgi:application"]

    def manage(self, *args: str) -> str:
        """The project's own ``manage.py``."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=self.var_dir / "project",
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout


def make_project(where: Path) -> Path:
    """``startproject mysite`` with Leasecast added as docs/tasks.md says."""
    project = where / "project"
    project.mkdir()
    subprocess.run(
        [sys.executable, "-m", "django", "startproject", "mysite", str(project)],
        check=True,
        capture_output=True,
    )
    package = project / "mysite"
    settings = package / "settings.py"
    settings.write_text(
        "import os\n"
        + settings.read_text()
        + "\n"
        + doc_block("# mysite/settings.py: added at the end")
        + TEST_SETTINGS
    )
    (package / "asgi.py").write_text(doc_block("# mysite/asgi.py"))
    (package / "urls.py").write_text(textwrap.dedent(URLS))
    (package / "views.py").write_text(textwrap.dedent(VIEWS))
    (package / "tasks.py").write_text(textwrap.dedent(TASKS))
    return project


def host_env(project: Path, debug: bool, database_url: str | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GATEWAY_")
        and k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "PYTHONPATH")
    }
    env["DJANGO_SETTINGS_MODULE"] = "mysite.settings"
    env["PYTHONPATH"] = str(project)
    env["HOST_DEBUG"] = "1" if debug else "0"
    if database_url:
        env["DATABASE_URL"] = database_url
    return env


@contextmanager
def fresh_postgres() -> Iterator[str]:
    """The URL of an empty PostgreSQL database, dropped afterwards."""
    import psycopg

    name = f"leasecast_host_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(
    scope="module",
    params=[
        ("sqlite", True),
        ("sqlite", False),
        ("postgres", True),
        ("postgres", False),
    ],
    ids=["sqlite-debug", "sqlite-nodebug", "postgres-debug", "postgres-nodebug"],
)
def host(request: pytest.FixtureRequest) -> Iterator[tuple[HostProcess, str]]:
    """The new project served by daphne, and an admin token of its Leasecast."""
    database, debug = request.param
    if database == "postgres":
        reason = postgres_unavailable()
        if reason:
            pytest.skip(reason)
    var = Path(tempfile.mkdtemp(prefix=f"leasecast-host-{database}-"))
    with ExitStack() as stack:
        url = stack.enter_context(fresh_postgres()) if database == "postgres" else None
        project = make_project(var)
        process = HostProcess(host_env(project, debug, url), var, name="host")
        process.manage("migrate", "--noinput", "-v0")
        process.env["DJANGO_SUPERUSER_PASSWORD"] = PASSWORD
        process.manage("createsuperuser", "--noinput", "--username", "op", "--email", "op@x.org")
        token = process.issue_token("admin", name="host-admin")
        process.start()
        stack.callback(process.stop)
        yield process, token


def test_a_view_enqueues_a_message_and_a_task_in_its_transaction(
    host: tuple[HostProcess, str],
) -> None:
    process, token = host
    status, placed = http("POST", f"{process.http}/place/", body={})
    assert status == 201, (placed, process.log_text()[-3000:])
    status, listed = http("GET", f"{process.http}/api/queues/host.orders/messages", token)
    assert status == 200
    assert [(m["id"], m["body"]) for m in listed["messages"]] == [(placed["message"], {"order": 1})]
    status, listed = http("GET", f"{process.http}/api/queues/default/messages", token)
    assert status == 200
    (task,) = listed["messages"]
    assert (task["body"]["id"], task["body"]["args"]) == (placed["task"], [7])


def fetch(opener: urllib.request.OpenerDirector, url: str, data: bytes | None = None) -> str:
    """GET (or POST ``data``) through ``opener``; the body, which must be a 200."""
    with opener.open(url, data=data, timeout=30) as response:
        assert response.status == 200, url
        body: bytes = response.read()
        assert body, url
        return body.decode()


def test_the_admin_and_the_dashboard_get_their_static_files(
    host: tuple[HostProcess, str],
) -> None:
    process, _ = host
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
    login = fetch(opener, f"{process.http}/admin/login/")
    # The admin's styles: every stylesheet the login page links is served.
    sheets = re.findall(r'<link[^>]+href="(/static/[^"]+\.css)"', login)
    assert any(sheet.startswith("/static/admin/") for sheet in sheets), sheets
    for sheet in sheets:
        assert "{" in fetch(opener, process.http + sheet), sheet
    # Log in as staff; the dashboard's page and the script it loads.
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login)
    assert csrf is not None
    form = {"csrfmiddlewaretoken": csrf[1], "username": "op", "password": PASSWORD}
    fetch(
        opener,
        f"{process.http}/admin/login/?next=/admin/",
        urllib.parse.urlencode(form).encode(),
    )
    dashboard = fetch(opener, f"{process.http}/dashboard/")
    scripts = re.findall(r'<script[^>]+src="(/static/[^"]+\.js)"', dashboard)
    assert "/static/dashboard/dashboard.js" in scripts, scripts
    for script in scripts:
        assert "function" in fetch(opener, process.http + script), script
    # The JavaScript client, for a project's own pages.
    assert "WebSocket" in fetch(opener, f"{process.http}/static/leasecast/leasecast.js")
