"""Serving adapters: thin glue hosting one ``AsyncEngine`` in BentoML, LitServe or Triton.

Each adapter uses only the public engine API and the shared OpenAI layer
(``paged_core.openai``); ``paged_core.adapters.launch.serve`` starts any of
them the documented way. Framework imports stay inside the subpackages, so
importing this package needs none of them.
"""
