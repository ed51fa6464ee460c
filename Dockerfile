# Multi-stage: build a wheel-free virtualenv, then copy it into a slim, non-root runtime image.
FROM python:3.11-slim AS build
WORKDIR /app
RUN python -m venv /venv
COPY pyproject.toml README.md ./
COPY service ./service
COPY migrations ./migrations
COPY alembic.ini ./
RUN /venv/bin/pip install --no-cache-dir -e .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 latebandit
WORKDIR /app
COPY --from=build /venv /venv
COPY --from=build /app /app
USER latebandit
ENV PATH=/venv/bin:$PATH LATEBANDIT_HOST=0.0.0.0
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"
CMD ["latebandit", "serve", "--host", "0.0.0.0", "--port", "8000"]
