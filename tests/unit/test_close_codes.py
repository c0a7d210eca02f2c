"""One table of close codes: the Python client's ``CloseCode``, the JavaScript
client's ``CloseCode`` (and its declarations), and the gateway's uses of them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from leasecast import CloseCode

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / "clients" / "js"

#: ``NAME: 4400,`` lines between ``export const CloseCode = Object.freeze({`` and ``});``
_JS_TABLE = re.compile(r"export const CloseCode = Object\.freeze\(\{(?P<body>.*?)\}\);", re.S)
#: ``readonly NAME: 4400;`` lines of the declaration
_DTS_TABLE = re.compile(r"export declare const CloseCode: \{(?P<body>.*?)\};", re.S)
_ENTRY = re.compile(r"^\s*(?:readonly\s+)?([A-Z_]+):\s*(\d+)[,;]?\s*(?://.*)?$")


def _table(text: str, pattern: re.Pattern[str]) -> dict[str, int]:
    match = pattern.search(text)
    assert match is not None, f"no CloseCode table matching {pattern.pattern!r}"
    table = {}
    for line in match["body"].splitlines():
        line = line.strip()
        if not line or line.startswith(("//", "/*", "*")):
            continue
        entry = _ENTRY.match(line)
        assert entry is not None, f"unexpected line in the CloseCode table: {line!r}"
        table[entry[1]] = int(entry[2])
    return table


def test_the_javascript_client_has_the_same_close_codes() -> None:
    expected = {code.name: code.value for code in CloseCode}
    assert _table((JS / "leasecast.js").read_text(), _JS_TABLE) == expected
    assert _table((JS / "leasecast.d.ts").read_text(), _DTS_TABLE) == expected


def test_no_close_code_is_a_bare_number() -> None:
    # A close code is named (CloseCode.X) wherever the gateway or a client
    # closes a socket or looks at how one closed.
    numbers = {str(code.value) for code in CloseCode}
    found = []
    for top in ("gateway", "consumers", "dashboard", "clients/python/src/leasecast"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.endswith("close_codes.py") or "/migrations/" in rel:
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if _bare_close_code(node, numbers):
                    found.append(f"{rel}:{getattr(node, 'lineno', 0)}")
    assert found == []


def _is_int(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _bare_close_code(node: ast.AST, numbers: set[str]) -> bool:
    """A 4xxx number, a number given to a close, or a number as a close message's code."""
    if _is_int(node):
        # 4000 is also a batch size (GATEWAY_BATCH_MAX_OPS): found in closes below.
        return str(node.value) in numbers and node.value > 4000  # type: ignore[attr-defined]
    if isinstance(node, ast.Assign) and _is_int(node.value):
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        return any("CLOSE" in n or n in CloseCode.__members__ for n in names)
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in {"close", "push_close", "close_sockets", "sendClose"}:
            return any(_is_int(a) for a in node.args) or any(
                _is_int(k.value) for k in node.keywords
            )
        return any(k.arg == "code" and _is_int(k.value) for k in node.keywords)
    if isinstance(node, ast.Dict):
        return any(
            isinstance(k, ast.Constant) and k.value == "code" and _is_int(v)
            for k, v in zip(node.keys, node.values, strict=True)
        )
    return False


def test_the_javascript_client_names_its_close_codes() -> None:
    numbers = "|".join(str(code.value) for code in CloseCode)
    bare = re.compile(rf"(?:===|!==|==|\(|=)\s*({numbers})\b")
    text = _JS_TABLE.sub("", (JS / "leasecast.js").read_text())
    found = [
        line.strip()
        for line in text.splitlines()
        if not line.lstrip().startswith(("//", "*", "/*")) and bare.search(line.split("//")[0])
    ]
    assert found == []
