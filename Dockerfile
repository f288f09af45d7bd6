# The trainwatch checker image: `trainwatch serve` and nothing it does not need.
#
# The checker never imports torch (only the training-side producers do), so the
# image installs trainwatch without it and stays a few hundred MB instead of several GB.
#
#   docker build -t trainwatch-checker .
#   docker run --rm trainwatch-checker serve --bootstrap kafka:9092 --metrics-host 0.0.0.0

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the package build reads (see .dockerignore), so that editing tests,
# examples or deploy/ does not invalidate this layer.
COPY pyproject.toml README.md ./
COPY invariants ./invariants
COPY producers ./producers
COPY stream_checkers ./stream_checkers
COPY trainwatch ./trainwatch
COPY trainwatch_version.py ./
RUN python -m venv /opt/trainwatch \
 && /opt/trainwatch/bin/pip install --upgrade pip \
 && /opt/trainwatch/bin/pip install . \
 && /opt/trainwatch/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="trainwatch checker" \
      org.opencontainers.image.description="Streaming checker of training invariants (trainwatch serve)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/trainwatch/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TRAINWATCH_METRICS_HOST=0.0.0.0 \
    TRAINWATCH_METRICS_PORT=9464
RUN useradd --system --uid 10001 --home-dir /var/lib/trainwatch --create-home trainwatch
COPY --from=build /opt/trainwatch /opt/trainwatch
# Faust keeps its local table state under the working directory.
WORKDIR /var/lib/trainwatch
USER trainwatch
EXPOSE 9464
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=4 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/metrics' % os.environ.get('TRAINWATCH_METRICS_PORT', '9464'), timeout=3)"]
ENTRYPOINT ["trainwatch"]
CMD ["serve"]
