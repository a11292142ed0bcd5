"""LitServe adapter: ``python -m paged_core.adapters.litserve --host H --port P``.

See ``server.py`` for the design (OpenAI routes mounted on ``LitServer``'s app,
one engine in the single API-server process).
"""
