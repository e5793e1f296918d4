# The Conveyor worker image: Conveyor installed, your app under /app (on PYTHONPATH).
#
#   docker build -t conveyor:0.1.0 .
#
# Put your app in a derived image (what `conveyor deploy kubernetes --image` runs):
#
#   FROM conveyor:0.1.0
#   COPY shop.py /app/
#
# or mount it at /app:  docker run -v "$PWD:/app:ro" conveyor:0.1.0 worker shop:app --config …
# The entrypoint is `conveyor`; the arguments are its command (`worker APP_PATH …`).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /src
COPY pyproject.toml README.md _conveyor_cli.py ./
COPY conveyor ./conveyor
COPY configs ./configs
RUN pip install . \
    && rm -rf /src \
    && groupadd --system --gid 10001 conveyor \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --shell /usr/sbin/nologin conveyor \
    && mkdir /app

WORKDIR /app
ENV PYTHONPATH=/app
# Numeric, so that Kubernetes' runAsNonRoot can tell it is not root.
USER 10001:10001
ENTRYPOINT ["conveyor"]
CMD ["--help"]
