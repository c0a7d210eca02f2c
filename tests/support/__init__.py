"""What the tests share, imported by every test that needs it (never from another test module).

- :mod:`tests.support.fakes`: stand-ins for the unit tests of the pure cores (``FakeClock``).
- :mod:`tests.support.fake_gateway`: an in-memory gateway on a real ``websockets`` server,
  for the Python client's unit tests.
- :mod:`tests.support.store`: one store op at a time, for the store's unit tests.
- :mod:`tests.support.waiting`: :func:`~tests.support.waiting.wait_until`, the one bounded
  wait for a condition (no fixed sleeps), with one default time-out.
- :mod:`tests.support.tokens`: signed tokens as a user's backend mints them (PyJWT).
- :mod:`tests.support.databases`: real SQLite and PostgreSQL databases, and Redis.
- :mod:`tests.support.gateways`: real gateway processes (daphne, uvicorn), two on one
  Redis, haproxy in front.
- :mod:`tests.support.clients`: HTTP and WebSocket clients of a running gateway.
- :mod:`tests.support.browsers`: Debian's Chromium for the browser tests.
"""
