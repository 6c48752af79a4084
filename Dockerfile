# The composer binary in a small image (used by docker-compose.yml).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p composer-cli

FROM debian:bookworm-slim
# ca-certificates: HTTP nodes call https endpoints
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* && useradd --system composer
COPY --from=build /src/target/release/composer /usr/local/bin/composer
USER composer
EXPOSE 7070
ENTRYPOINT ["composer"]
CMD ["serve"]
