# Multi-stage: dependencies and the package are installed into a virtualenv in a build stage (with pip and
# its caches), then only that virtualenv is copied into a slim runtime that runs as a non-root user. A
# regular install, without the plots extra: the Alembic migrations ship inside the package.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
RUN python -m venv /venv
COPY pyproject.toml README.md alembic.ini ./
COPY service ./service
RUN /venv/bin/pip install . && /venv/bin/python -m compileall -q /venv

FROM python:3.11-slim AS runtime
RUN useradd --create-home --uid 10001 --user-group latebandit \
 && install -d -o latebandit -g latebandit /var/lib/latebandit /var/spool/latebandit
COPY --from=build /venv /venv
# The working directory is the embedded default's home (SQLite audit file and secret); the code is read-only.
WORKDIR /var/lib/latebandit
USER 10001:10001
ENV PATH=/venv/bin:$PATH PYTHONUNBUFFERED=1 LATEBANDIT_HOST=0.0.0.0 LATEBANDIT_PORT=8000
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
# Without LATEBANDIT_API_KEYS, serve refuses this non-loopback bind (set keys, or pass --insecure knowingly).
CMD ["latebandit", "serve", "--host", "0.0.0.0", "--port", "8000"]
