"""Serve: the HTTP endpoint (FastAPI over vLLM's async engine) for base model + LoRA adapters.

``app`` (factory + lifespan), ``routes_*`` (one router per resource: classify, adapters, health,
metrics), ``deps`` (Annotated dependencies: state, bearer auth, ready engine), ``settings``
(pydantic-settings; refuses to start without a token), ``engine`` (``AsyncLLM`` + the shared
``Scorer``), ``adapters`` (registry look-ups, verification cache, pilot gate), ``errors`` (the one
JSON error shape), ``metrics`` (Prometheus + body-size middleware), ``cli`` (``docpilot serve``).
See docs/serving.md.
"""
