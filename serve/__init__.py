"""Serve: the HTTP endpoint (FastAPI over vLLM's async engine) for base model + LoRA adapters."""
