# One image, both binaries: the entrypoint is warmpath-router; run the agent
# with `--entrypoint warmpath-agent` (Kubernetes: `command: [warmpath-agent]`).
#
#   podman build -t warmpath:0.1.0 .          # or: docker build -t warmpath:0.1.0 .
#
# Build arguments (the defaults make the published image):
#   RUST_IMAGE  toolchain of the build stage
#   BASE_IMAGE  runtime base: glibc, libgcc and CA certificates, nothing else
#   BINARIES    `build`: compile the release binaries in RUST_IMAGE (fat LTO,
#               ~9 min); `prebuilt`: copy bin/ of the build context instead.
#               tests/container_image.sh builds this file offline that way, on a
#               Debian rootfs made with debootstrap, since no registry is reachable there.
ARG RUST_IMAGE=docker.io/library/rust:1-slim-bookworm
ARG BASE_IMAGE=gcr.io/distroless/cc-debian12:nonroot
ARG BINARIES=build

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
# protobuf is compiled by protox and TLS is rustls: no system libraries needed.
RUN cargo build --profile dist --locked -p warmpath-router -p warmpath-agent \
 && mkdir /out \
 && cp target/dist/warmpath-router target/dist/warmpath-agent /out/

FROM scratch AS prebuilt
COPY bin/warmpath-router bin/warmpath-agent /out/

FROM ${BINARIES} AS binaries

FROM ${BASE_IMAGE}
COPY --from=binaries /out/warmpath-router /out/warmpath-agent /usr/local/bin/
ENV PATH=/usr/local/bin:/usr/bin:/bin
# distroless's `nonroot`; numeric, so any base works without a passwd entry.
USER 65532:65532
# HTTP (OpenAI API, /metrics, probes) and the agents' gRPC ingest.
EXPOSE 8080 50051
ENTRYPOINT ["warmpath-router"]
