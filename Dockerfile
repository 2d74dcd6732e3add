# Multi-stage build: compile in the Rust image, run from a slim Debian image as a non-root user.
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin pinlb

FROM debian:bookworm-slim
RUN useradd --system --no-create-home --shell /usr/sbin/nologin pinlb
COPY --from=build /src/target/release/pinlb /usr/local/bin/pinlb
COPY config/pinlb.toml /etc/pinlb/pinlb.toml
USER pinlb
# Mount your own file over /etc/pinlb/pinlb.toml; `pinlb check -c` validates it first.
ENTRYPOINT ["pinlb"]
CMD ["serve", "-c", "/etc/pinlb/pinlb.toml"]
