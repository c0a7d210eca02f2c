"""The standalone service and the wiring of the adapters: settings, ASGI
application, URLs, WebSocket routing and the demo. Only this layer imports the
Channels consumers (``consumers/``) and the dashboard (``dashboard/``).
"""
