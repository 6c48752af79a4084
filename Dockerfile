# The composer binary in a small image (used by docker-compose.yml).
# The dashboard is built first: the release build embeds dashboard/dist.
FROM node:22-bookworm-slim AS dashboard
# the dashboard uses the TypeScript SDK by path: build it first
WORKDIR /src/sdks/typescript
COPY sdks/typescript/ ./
RUN npm ci && npx tsc -p tsconfig.json
WORKDIR /src/dashboard
COPY dashboard/package.json dashboard/package-lock.json ./
RUN npm ci
COPY dashboard/ ./
RUN npm run build

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
COPY --from=dashboard /src/dashboard/dist dashboard/dist
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
