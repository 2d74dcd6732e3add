# Multi-stage build: compile in the Rust image, run from a slim Debian image as a non-root user.
#
#   docker build -t pinlb .
#   docker run -p 8888:8888 -p 9901:9901 \
#     -v "$PWD/admin-token:/run/secrets/pinlb_admin_token:ro" pinlb
#
# docs/operations.md ("In a container") has the rest.
FROM docker.io/library/rust:1-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# Cargo.toml declares the `select` bench, so its file must exist for the manifest to load.
COPY benches/select.rs ./benches/select.rs
# The release profile keeps line tables for profilers (debug = 1); the image needs none:
# without debug info and symbols the binary shrinks from 26 MB to about 4 MB.
RUN CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
    cargo build --release --locked --bin pinlb

FROM docker.io/library/debian:bookworm-slim
RUN useradd --system --no-create-home --shell /usr/sbin/nologin pinlb
COPY --from=build /src/target/release/pinlb /usr/local/bin/pinlb
# Listens on 0.0.0.0:8888, admin on 0.0.0.0:9901 with its token from
# /run/secrets/pinlb_admin_token. Mount your own file over it for your backends.
COPY config/container.toml /etc/pinlb/pinlb.toml
USER pinlb
EXPOSE 8888 9901
ENTRYPOINT ["pinlb"]
CMD ["serve", "-c", "/etc/pinlb/pinlb.toml"]
