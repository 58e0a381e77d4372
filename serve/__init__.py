"""Serve: the HTTP endpoint (FastAPI over vLLM's async engine) for base model + LoRA adapters.

``app`` (factory + lifespan), ``routes_*`` (one router per resource: classify, adapters, health,
metrics), ``deps`` (Annotated dependencies: state, bearer auth, ready engine), ``settings``
(pydantic-settings; refuses to start without a token), ``engine`` (``AsyncLLM`` + the shared
``Scorer``), ``adapters`` (registry look-ups, verified private copies, pilot gate), ``errors`` (the one
JSON error shape), ``metrics`` (Prometheus + body-size middleware), ``guard`` (the token checked from the
headers, before the body), ``body`` (the classify body parsed off the event loop), ``admission`` (documents
in flight, 429 beyond), ``cli`` (``docpilot serve``, uvicorn on h11 with a header limit).
See docs/serving.md.
"""
