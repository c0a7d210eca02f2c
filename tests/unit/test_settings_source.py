"""One source for every setting: ``gateway.conf``.

Every ``GATEWAY_*`` default is written once, in ``GatewaySettings``; only
``gateway/conf.py`` (the settings object's readers) and the standalone
service's Django settings module (which builds Django settings from the
environment, with the defaults of ``GatewaySettings``) read the environment
for them.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from gateway.conf import GatewaySettings, environ_settings

ROOT = Path(__file__).resolve().parents[2]
TREES = ("gateway", "consumers", "dashboard", "bench", "clients/spark/src", "clients/python/src")

#: The modules that may read the environment for a setting.
READERS = {"gateway/conf.py", "gateway/site/settings.py"}


@cache
def _modules() -> list[tuple[str, ast.Module]]:
    found = []
    for top in TREES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" not in rel:
                found.append((rel, ast.parse(path.read_text(), rel)))
    return found


def _is_environ(node: ast.AST) -> bool:
    """``os.environ``, or ``os.getenv``."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr in {"environ", "getenv"}
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _environ_reads(tree: ast.Module) -> list[tuple[int, str | None]]:
    """Each read of one variable: ``os.environ.get(K)``, ``os.environ[K]``,
    ``os.getenv(K)``, with K when it is a string constant."""
    reads = []
    for node in ast.walk(tree):
        key: ast.AST | None = None
        if isinstance(node, ast.Call):
            func = node.func
            getter = isinstance(func, ast.Attribute) and func.attr == "get"
            if not (_is_environ(func) or (getter and _is_environ(func.value))):
                continue
            key = node.args[0] if node.args else None
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            key = node.slice
        else:
            continue
        name = key.value if isinstance(key, ast.Constant) else None
        reads.append((node.lineno, name if isinstance(name, str) else None))
    return reads


def test_only_the_settings_readers_read_gateway_variables() -> None:
    # A read of an unnamed variable (os.environ.get(name)) counts too: it is
    # how a helper re-reads settings behind the settings object's back.
    found = [
        f"{rel}:{line}: {name or '<a variable>'}"
        for rel, tree in _modules()
        if rel not in READERS
        for line, name in _environ_reads(tree)
        if name is None or name.startswith("GATEWAY_")
    ]
    assert found == []


def _value(node: ast.AST) -> object:
    """The value of a constant expression (``8 * 1024 * 1024``), else a marker."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        if isinstance(node, ast.BinOp):
            left, right = _value(node.left), _value(node.right)
            numbers = isinstance(left, int | float) and isinstance(right, int | float)
            if numbers and isinstance(node.op, ast.Mult):
                return left * right
        return _value


def test_the_settings_module_takes_its_defaults_from_the_settings_object() -> None:
    # In gateway/site/settings.py, a GATEWAY_* variable the settings object
    # has must default to the object's value, not to a number written again.
    fields = {f"GATEWAY_{name.upper()}" for name in GatewaySettings.__dataclass_fields__}
    tree = ast.parse((ROOT / "gateway/site/settings.py").read_text())
    written = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and len(node.args) >= 2):
            continue
        name, default = node.args[0], node.args[1]
        # An empty string is "unset" (no signing key...), not a default written again.
        again = _value(default) not in (_value, "")
        if isinstance(name, ast.Constant) and name.value in fields and again:
            written.append(f"{name.value} defaults to {ast.unparse(default)}")
    assert written == []


@pytest.mark.parametrize(
    ("value", "field", "home"),
    [
        (8 * 1024 * 1024, "max_frame_bytes", "gateway/conf.py"),
        (16 * 1024 * 1024, "max_request_bytes", "gateway/conf.py"),
        # The parser's limit: the pure core holds it (it parses without Django).
        (256 * 1024, "max_body_bytes", "gateway/core/protocol.py"),
    ],
)
def test_size_defaults_are_written_once(value: int, field: str, home: str) -> None:
    assert getattr(GatewaySettings(), field) == value
    found = [
        f"{rel}:{node.lineno}"
        for rel, tree in _modules()
        if rel != home
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp | ast.Constant) and _value(node) == value
    ]
    assert found == []


def test_the_server_reads_its_options_through_the_settings_object() -> None:
    d = GatewaySettings()
    assert environ_settings({}) == d
    options = environ_settings(
        {
            "GATEWAY_MAX_FRAME_BYTES": "1024",
            "GATEWAY_SHUTDOWN_GRACE": "2.5",
            "GATEWAY_PING_INTERVAL": "",  # empty: unset
            "GATEWAY_MAX_PENDING_PER_ADDRESS": "0",
            "GATEWAY_WEBSOCKET_MAX_AGE": "-1",
        }
    )
    assert (options.max_frame_bytes, options.shutdown_grace) == (1024, 2.5)
    assert options.ping_interval == d.ping_interval
    assert options.max_pending_per_address == 0 and options.websocket_max_age == -1
    for name, bad in [
        ("GATEWAY_MAX_FRAME_BYTES", "8M"),
        ("GATEWAY_MAX_FRAME_BYTES", "0"),
        ("GATEWAY_SHUTDOWN_GRACE", "-1"),
        ("GATEWAY_PING_TIMEOUT", "inf"),
        ("GATEWAY_WEBSOCKET_MAX_AGE", "-2"),
    ]:
        with pytest.raises(ValueError, match=name):
            environ_settings({name: bad})
