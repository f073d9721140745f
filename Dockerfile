# The group coordinator (`coordinator serve`) and its test consumers (`coordinator simulate`).
# Kafka is not in this image: point --bootstrap-server at a cluster (compose.yaml starts one).
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY coordinator ./coordinator
COPY analytics ./analytics
COPY simulator ./simulator
RUN python -m venv /opt/coordinator \
 && /opt/coordinator/bin/pip install --no-cache-dir '.[speed]'

FROM python:3.11-slim-bookworm
COPY --from=build /opt/coordinator /opt/coordinator
ENV PATH=/opt/coordinator/bin:$PATH \
    PYTHONUNBUFFERED=1
RUN useradd --system --uid 10001 --no-create-home coordinator
USER 10001
EXPOSE 9192
ENTRYPOINT ["coordinator"]
CMD ["serve", "--listen=0.0.0.0:9192"]
