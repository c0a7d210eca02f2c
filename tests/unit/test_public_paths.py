"""The paths users import and run keep working after gateway/ was split into layers.

Each old module is a thin re-export of the layer that holds the code now
(docs/design.md, Layers); these are the names the docs tell users to import.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

#: public path -> (name, the module that defines it now)
PUBLIC = {
    "gateway.tasks": ("LeasecastBackend", "gateway.host.tasks"),
    "gateway.tokens": ("signed_token", "gateway.access.tokens"),
    "gateway.api_urls": ("urlpatterns", "gateway.site.api_urls"),
    "gateway.routing": ("websocket_application", "gateway.site.routing"),
    "gateway.redact": ("install_log_redaction", "gateway.server.redact"),
    "gateway.cors": ("CrossOrigin", "gateway.server.cors"),
    "gateway.login_throttle": ("ThrottledModelBackend", "gateway.access.login_throttle"),
    "gateway.errors": ("QueueFull", "gateway.core.errors"),
    "gateway.task_worker": ("UnregisteredTask", "gateway.host.task_worker"),
    "gateway.serve": ("main", "gateway.server.serve"),
    "gateway.demo": ("main", "gateway.site.demo"),
}


@pytest.mark.parametrize("public", sorted(PUBLIC))
def test_a_public_path_hands_on_the_layers_object(public: str) -> None:
    name, home = PUBLIC[public]
    assert getattr(importlib.import_module(public), name) is getattr(
        importlib.import_module(home), name
    )


def test_the_settings_module_and_asgi_application_keep_their_paths() -> None:
    import gateway.asgi
    import gateway.settings
    import gateway.site.asgi
    import gateway.site.settings

    assert gateway.settings.INSTALLED_APPS == gateway.site.settings.INSTALLED_APPS
    assert gateway.asgi.application is gateway.site.asgi.application


def test_enqueue_is_still_on_the_package() -> None:
    import gateway
    from gateway.host import producer

    assert gateway.enqueue is producer.enqueue
    assert gateway.aenqueue is producer.aenqueue


def test_an_unknown_tasks_error_path_resolves_at_its_public_path() -> None:
    # A stored task result names the error's class by this path (docs/tasks.md).
    from gateway.host.task_worker import UnregisteredTask

    path = f"{UnregisteredTask.__module__}.{UnregisteredTask.__qualname__}"
    assert path == "gateway.task_worker.UnregisteredTask"
    module, _, name = path.rpartition(".")
    assert getattr(importlib.import_module(module), name) is UnregisteredTask


def test_python_m_gateway_serve_still_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.serve", "--server", "nothing"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--server must be one of daphne, uvicorn" in done.stderr
