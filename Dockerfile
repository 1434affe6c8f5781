# compactd application image: gateway, worker and flower all run from it.
# Multi-stage: build a wheel-only virtualenv, then copy it into a slim runtime as a non-root user.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY pipeline ./pipeline
COPY storage ./storage
COPY tasks ./tasks
COPY compactd ./compactd
COPY gateway ./gateway
RUN python -m venv /opt/venv && /opt/venv/bin/pip install --upgrade pip && \
    /opt/venv/bin/pip install .

FROM python:3.11-slim AS runtime
RUN groupadd --system --gid 10001 compactd && \
    useradd --system --uid 10001 --gid compactd --home-dir /app --shell /usr/sbin/nologin compactd
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /app
USER compactd:compactd
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --retries=5 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=3)"
CMD ["compactd", "serve", "--host", "0.0.0.0", "--port", "8080"]
