// `npm run bench`: the graph benchmark in Debian's headless chromium.
import { defineConfig } from "@playwright/test";

export default defineConfig({
  testDir: ".",
  testMatch: "*.bench.ts",
  timeout: 120_000,
  workers: 1,
  reporter: [["list"]],
  use: { launchOptions: { executablePath: process.env["CHROMIUM_PATH"] ?? "/usr/bin/chromium", args: ["--no-sandbox"] } },
});
