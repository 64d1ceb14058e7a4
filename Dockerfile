# syntax=docker/dockerfile:1
# runner in a container: `runner serve` over the workflows baked into the image.
#
#   docker build -t runner .
#   docker run -p 2024:2024 -e RUNNER_API_KEY=secret -e OPENAI_API_KEY=... runner
#
# The server listens on 0.0.0.0 inside the container, so it requires the API key named by
# --api-key-env (runner refuses to serve a non-loopback address without one). Mount a volume
# on /data to keep threads, runs and long-term memory across containers; mount your own
# workflows on /app/workflows (and prompts on /app/prompts) to serve them instead.

# --- build -----------------------------------------------------------------------------------
# The toolchain the project is tested with (Cargo.lock was resolved with it).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The registry and target caches survive between builds (BuildKit); the binary is copied out
# of the cache mount before the layer ends. The image runs on bookworm's glibc 2.36, so the
# binary links with packed relative relocations (DT_RELR): its megabyte of relocation table is
# no longer read into memory at every start.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    RUNNER_PACKED_RELOCS=1 cargo build --release --locked --bin runner \
    && strip -o /runner target/release/runner

# --- run -------------------------------------------------------------------------------------
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /data --create-home runner
COPY --from=build /runner /usr/local/bin/runner
WORKDIR /app
COPY workflows workflows
COPY prompts prompts
COPY schemas schemas
USER runner
ENV RUNNER_DB=/data/runner.db \
    RUNNER_DATA_DB=/data/data.db
VOLUME ["/data"]
EXPOSE 2024
ENTRYPOINT ["runner"]
CMD ["serve", "workflows", "--host", "0.0.0.0", "--port", "2024", "--api-key-env", "RUNNER_API_KEY"]
