"""The example shop (examples/shop) as a real daphne process, for the tests that run it."""

from __future__ import annotations

import subprocess
import sys

from tests.support.databases import ROOT
from tests.support.gateways import DAPHNE, GatewayProcess

__all__ = ["SHOP", "ShopProcess", "shop_env"]

SHOP = ROOT / "examples" / "shop"


class ShopProcess(GatewayProcess):
    """daphne serving ``shop.asgi:application`` (with Leasecast's daphne defaults)."""

    def command(self) -> list[str]:
        return [*DAPHNE, "-b", "127.0.0.1", "-p", str(self.port), "shop.asgi:application"]

    def manage(self, *args: str) -> str:
        """The shop's own ``manage.py``."""
        done = subprocess.run(
            [sys.executable, str(SHOP / "manage.py"), *args],
            cwd=SHOP,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout


def shop_env(env: dict[str, str]) -> dict[str, str]:
    """The shop's environment on the database of ``env`` (a migrated Leasecast database)."""
    shop = {
        k: v
        for k, v in env.items()
        if not k.startswith("GATEWAY_") and k not in ("DJANGO_SETTINGS_MODULE",)
    }
    shop["DJANGO_SETTINGS_MODULE"] = "shop.settings"
    shop["PYTHONPATH"] = f"{SHOP}:{ROOT}"
    if "DATABASE_URL" not in env:
        shop["DATABASE_URL"] = f"sqlite:///{env['GATEWAY_SQLITE_PATH']}"
    return shop
