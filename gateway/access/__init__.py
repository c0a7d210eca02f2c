"""Who a request is: stored and signed tokens, sessions, the login throttle.

Above the store (it reads tokens and sessions through Django's models) and
below the runtime, which owns the watch that closes revoked tokens' sockets.
"""
