"""Serving: ``python -m gateway.serve`` (daphne or uvicorn), its options, request
and connection limits, log redaction, CORS, transport flow and graceful shutdown.
"""
