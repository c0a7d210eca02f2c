"""Throttled password logins: Django's ``ModelBackend`` behind a failure counter.

After ``GATEWAY_LOGIN_FAILURES`` failed passwords for one user name from one
client address within ``GATEWAY_LOGIN_LOCKOUT`` seconds, every further
attempt for that pair is refused, right password or not, until the window
has passed since the last failure; the login form shows its usual error. A
success clears the pair's count. Counting the pair (not the name alone)
keeps a stranger from locking a staff user out from elsewhere.

The counts live in each process's memory, like the per-token limits: behind
N processes a guesser gets up to N times the allowance, still a handful of
guesses where it had thousands a minute. The table is bounded, oldest pairs
forgotten first, so ever-new names cost bounded memory.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

__all__ = ["LoginThrottle", "ThrottledModelBackend"]

#: Pairs remembered at most; the least recently failed are forgotten first.
MAX_PAIRS = 100_000


class LoginThrottle:
    """Failure counts per ``(user name, address)``.

    Args:
        failures: failures allowed within ``lockout`` seconds; 0 turns throttling off.
        lockout: seconds a pair stays refused after its last counted failure.
    """

    def __init__(self, failures: int, lockout: float, clock: Any = time.monotonic) -> None:
        self.failures = failures
        self.lockout = lockout
        self._clock = clock
        self._lock = threading.Lock()
        # pair -> (failures, time of the last one)
        self._pairs: OrderedDict[tuple[str, str], tuple[int, float]] = OrderedDict()

    def _current(self, pair: tuple[str, str], now: float) -> int:
        found = self._pairs.get(pair)
        if found is None:
            return 0
        count, last = found
        if now - last >= self.lockout:
            del self._pairs[pair]
            return 0
        return count

    def refused(self, pair: tuple[str, str]) -> bool:
        """Whether this pair has used up its failures."""
        if self.failures <= 0:
            return False
        with self._lock:
            return self._current(pair, self._clock()) >= self.failures

    def failed(self, pair: tuple[str, str]) -> None:
        """Count one failure of this pair."""
        if self.failures <= 0:
            return
        with self._lock:
            now = self._clock()
            self._pairs[pair] = (self._current(pair, now) + 1, now)
            self._pairs.move_to_end(pair)
            while len(self._pairs) > MAX_PAIRS:
                self._pairs.popitem(last=False)

    def succeeded(self, pair: tuple[str, str]) -> None:
        """Forget this pair's failures."""
        with self._lock:
            self._pairs.pop(pair, None)


_throttle: LoginThrottle | None = None


def throttle() -> LoginThrottle:
    """This process's throttle, from the settings (``GATEWAY_LOGIN_*``)."""
    global _throttle
    if _throttle is None:
        from django.conf import settings

        _throttle = LoginThrottle(
            int(getattr(settings, "GATEWAY_LOGIN_FAILURES", 5)),
            float(getattr(settings, "GATEWAY_LOGIN_LOCKOUT", 300.0)),
        )
    return _throttle


def _pair(request: HttpRequest | None, username: Any) -> tuple[str, str]:
    address = request.META.get("REMOTE_ADDR", "") if request is not None else ""
    return (str(username or "").casefold(), str(address))


class ThrottledModelBackend(ModelBackend):
    """``ModelBackend`` that refuses a user name and address after repeated failures.

    Refusing raises ``PermissionDenied``, which makes ``authenticate()`` stop
    and report a failed login, without checking the password (so a refused
    guess costs the server no password hash either).
    """

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """The user, None for a wrong password; refuses a throttled pair."""
        if username is None:
            from django.contrib.auth import get_user_model

            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if password is None:  # not a password login: nothing to guess, nothing to count
            return super().authenticate(request, username=username, password=password, **kwargs)
        pair = _pair(request, username)
        limits = throttle()
        if limits.refused(pair):
            raise PermissionDenied("too many failed logins; try again later")
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            limits.failed(pair)
        else:
            limits.succeeded(pair)
        return user
