// Builds the graph benchmark page (bench/graph.html) into bench/dist with the dashboard's code.
import react from "@vitejs/plugin-react";
import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

export default defineConfig({
  root: fileURLToPath(new URL(".", import.meta.url)),
  base: "./",
  plugins: [react()],
  logLevel: "warn",
  build: { outDir: "dist", emptyOutDir: true, assetsInlineLimit: 0, rollupOptions: { input: fileURLToPath(new URL("graph.html", import.meta.url)) } },
});
