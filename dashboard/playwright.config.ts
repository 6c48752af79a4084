// The dashboard's end-to-end tests: Debian's chromium (no browser download) against the real
// `composer serve`, which each test file starts on its own port with its own database
// (tests/harness.ts). Run them through scripts/test-dashboard.sh, which provides Postgres and Redis.
import { defineConfig } from "@playwright/test";

export default defineConfig({
  testDir: "tests",
  timeout: 90_000,
  expect: { timeout: 20_000 },
  fullyParallel: false,
  // two cores: one file's server, worker and browser at a time each
  workers: Number(process.env["DASHBOARD_TEST_WORKERS"] ?? 2),
  forbidOnly: true,
  // CI keeps the output of a run only: a test that fails once and then passes is reported as
  // flaky (by name, in the summary) rather than failing the change; twice fails it
  retries: process.env["CI"] ? 1 : 0,
  reporter: [["list"]],
  use: {
    launchOptions: { executablePath: process.env["CHROMIUM_PATH"] ?? "/usr/bin/chromium", args: ["--no-sandbox"] },
    viewport: { width: 1400, height: 900 },
    trace: "off",
  },
});
