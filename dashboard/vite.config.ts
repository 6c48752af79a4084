// The dashboard's build: static files in dist/ that `composer serve` serves at `/` under a strict
// Content-Security-Policy (no inline script or style), so nothing here may inline either.
import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

// `npm run dev`: grpc-web calls go to this server through Vite's proxy, so the page keeps
// calling its own origin as it does when the server serves it. The server must list Vite's
// origin in --cors-origins (it checks the Origin header of every browser call).
const devServer = process.env["COMPOSER_DEV_SERVER"] ?? "http://127.0.0.1:7070";

export default defineConfig({
  plugins: [react()],
  build: {
    outDir: "dist",
    assetsDir: "assets",
    // Inlined assets become data: URLs; fonts and scripts must not (CSP), so never inline.
    assetsInlineLimit: 0,
    sourcemap: false,
    // the libraries (React, dagre, protobuf, connect) in a chunk of their own: they change less
    // often than the pages, and each chunk stays under the 500 kB Vite warns at
    rolldownOptions: { output: { codeSplitting: { groups: [{ name: "vendor", test: /node_modules/ }] } } },
  },
  server: {
    host: "127.0.0.1",
    port: 5173,
    strictPort: true,
    proxy: { "/composer.v1.": { target: devServer, changeOrigin: false } },
  },
});
