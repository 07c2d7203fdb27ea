# One image with every dnsplan binary; docker-compose.yml runs each part from it.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# The four daemons and no feature: no enactor built here has the naive 2025 one (feature
# `testing`). enactor/tests/production_build.rs reads this command and checks cargo's features.
RUN cargo build --release --locked \
      -p dnsplan-authority -p dnsplan-planner -p dnsplan-enactor -p dnsplan-cli \
 && mkdir /out \
 && cp target/release/dnsplan-authority target/release/dnsplan-planner \
       target/release/dnsplan-enactor target/release/dnsplan /out/

FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates curl dnsutils \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home /data dnsplan \
 && mkdir -p /data && chown dnsplan /data
COPY --from=build /out/ /usr/local/bin/
COPY deploy/compose/ /etc/dnsplan/
USER dnsplan
VOLUME /data
EXPOSE 5353/udp 5353/tcp 8053/tcp
CMD ["dnsplan", "--help"]
