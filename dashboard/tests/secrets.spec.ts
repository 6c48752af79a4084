// The Secrets page: a value is set through the page and then appears nowhere, neither in the page
// nor in anything the server sends back; names and versions are listed a page at a time; a new
// version, a delete after a confirmation; the server's violation for a bad name next to the field;
// a reader, and a server without a key-encryption key, told so plainly; accessibility (axe).
import AxeBuilder from "@axe-core/playwright";
import { expect, test, type Page } from "@playwright/test";

import { Stack, guardPage, hex, openWithToken, useStack } from "./harness";

const stack = useStack([], { secretsKey: true });

async function seriousViolations(page: Page): Promise<string[]> {
  const result = await new AxeBuilder({ page }).analyze();
  return result.violations
    .filter((v) => v.impact === "serious" || v.impact === "critical")
    .map((v) => `${v.id} (${v.impact}): ${v.help} — ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`);
}

interface Exchange {
  url: string;
  /** Null when the body could not be read (a response cut short by a reload). */
  body: Buffer | null;
}

/** Every request body the page sends and every response body it receives, from now on. */
function captureTraffic(page: Page): { requests: Exchange[]; responses: () => Promise<Exchange[]> } {
  const requests: Exchange[] = [];
  const responses: Promise<Exchange>[] = [];
  page.on("request", (request) => {
    const body = request.postDataBuffer();
    if (body) requests.push({ url: request.url(), body });
  });
  page.on("response", (response) => {
    const url = response.url();
    responses.push(response.body().then((body) => ({ url, body }), () => ({ url, body: null })));
  });
  return { requests, responses: () => Promise.all(responses) };
}

async function setThroughPage(page: Page, name: string, value: string): Promise<void> {
  await page.getByLabel("Name", { exact: true }).fill(name);
  await page.getByLabel("Value", { exact: true }).fill(value);
  await page.getByRole("button", { name: "Set secret" }).click();
}

test("a secret set through the page is listed with its version and is never shown or sent back; delete asks first", async ({ page }) => {
  const check = guardPage(page);
  const traffic = captureTraffic(page);
  const s = hex();
  const name = `api-key-${s}`;
  const first = `first-value-${hex(16)}`;
  const second = `second-value-${hex(16)}`;
  const token = stack.token("operator", { namespace: `secrets-${s}`, subject: `ops-${s}` });

  await openWithToken(page, stack, token, "/runs");
  await page.getByRole("link", { name: "Secrets" }).click();
  await expect(page.getByRole("heading", { level: 1, name: "Secrets" })).toBeVisible();
  await expect(page.getByRole("link", { name: "Secrets" })).toHaveAttribute("aria-current", "page");
  await expect(page.getByText("No secret is stored in this namespace.")).toBeVisible();

  const nameInput = page.getByLabel("Name", { exact: true });
  const valueInput = page.getByLabel("Value", { exact: true });
  await expect(valueInput).toHaveAttribute("type", "password");
  await setThroughPage(page, name, first);
  await expect(page.getByRole("status")).toHaveText(`Set ${name}: version 1.`);
  const row = page.locator(`tr[data-secret="${name}"]`);
  await expect(row.locator("td.version")).toHaveText("1");
  await expect(row.locator("td.updated-by")).toHaveText(`ops-${s}`);
  // the form is emptied once the server has the value
  await expect(valueInput).toHaveValue("");
  await expect(nameInput).toHaveValue("");

  // a new version: the row's button puts the name in the form and the cursor in the value
  await row.getByRole("button", { name: `New value for ${name}` }).click();
  await expect(nameInput).toHaveValue(name);
  await expect(valueInput).toBeFocused();
  await valueInput.fill(second);
  await page.getByRole("button", { name: "Set secret" }).click();
  await expect(page.getByRole("status")).toHaveText(`Set ${name}: version 2.`);
  await expect(row.locator("td.version")).toHaveText("2");
  await expect(page.locator("tbody tr")).toHaveCount(1);
  await expect(valueInput).toHaveValue("");

  const html = await page.evaluate(() => document.documentElement.outerHTML);
  expect(html).toContain(name);
  expect(html).not.toContain(first);
  expect(html).not.toContain(second);
  expect(await seriousViolations(page)).toEqual([]);

  // delete asks first; keeping the secret changes nothing
  await row.getByRole("button", { name: `Delete ${name}` }).click();
  await expect(row).toContainText(`Delete ${name} and all its versions?`);
  await expect(row.getByRole("button", { name: `Keep ${name}` })).toBeFocused();
  expect(await seriousViolations(page)).toEqual([]);
  await row.getByRole("button", { name: `Keep ${name}` }).click();
  await expect(row.locator("td.version")).toHaveText("2");
  await row.getByRole("button", { name: `Delete ${name}` }).click();
  await row.getByRole("button", { name: `Confirm delete of ${name}` }).click();
  await expect(page.getByRole("status")).toHaveText(`Deleted ${name}.`);
  await expect(row).toHaveCount(0);
  await expect(page.getByText("No secret is stored in this namespace.")).toBeVisible();
  // and the server no longer has it
  await page.reload();
  await expect(page.getByText("No secret is stored in this namespace.")).toBeVisible();
  await expect(row).toHaveCount(0);

  const responses = await traffic.responses();
  const paths = responses.map((r) => new URL(r.url).pathname);
  for (const rpc of ["SetSecret", "ListSecrets", "DeleteSecret"]) expect(paths).toContain(`/composer.v1.SecretService/${rpc}`);
  // every answer of the API was read whole
  expect(responses.filter((r) => r.body === null && r.url.includes("/composer.v1.")).map((r) => r.url)).toEqual([]);
  for (const value of [first, second]) {
    const bytes = Buffer.from(value, "utf8");
    // the capture sees the value where it does travel: in the one SetSecret request that sent it
    expect(traffic.requests.filter((r) => r.body?.includes(bytes)).map((r) => new URL(r.url).pathname)).toEqual(["/composer.v1.SecretService/SetSecret"]);
    const carrying = responses.filter((r) => r.body && (r.body.includes(bytes) || r.body.toString("utf8").includes(value))).map((r) => r.url);
    expect(carrying, `responses carrying ${value}`).toEqual([]);
  }
  check();
});

test("a name breaking the rule: the page hints, and the server's violation shows next to the field", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  await openWithToken(page, stack, stack.token("admin", { namespace: `names-${s}` }), "/secrets");
  const nameInput = page.getByLabel("Name", { exact: true });
  await nameInput.fill(`bad:name-${s}`);
  await expect(page.locator("#secret-name-check")).toHaveText("This name breaks the rule: character ':' at position 3 is not allowed.");
  await page.getByLabel("Value", { exact: true }).fill(`value-${hex(16)}`);
  await page.getByRole("button", { name: "Set secret" }).click();

  // the server's words, which carry the rule, next to the field and tied to it
  const violation = page.locator("#secret-name-violation");
  await expect(violation).toContainText("character ':' at position 3 is not allowed (1 to 64 characters");
  await expect(violation).toHaveAttribute("role", "alert");
  await expect(nameInput).toHaveAttribute("aria-invalid", "true");
  await expect(nameInput).toHaveAttribute("aria-describedby", /\bsecret-name-violation\b/);
  await expect(page.getByText("No secret is stored in this namespace.")).toBeVisible();
  expect(await seriousViolations(page)).toEqual([]);

  // the verdict was about that name: a new one clears it, and a good one is stored
  await nameInput.fill(`good-name-${s}`);
  await expect(violation).toHaveCount(0);
  await expect(page.locator("#secret-name-check")).toHaveCount(0);
  await page.getByRole("button", { name: "Set secret" }).click();
  await expect(page.locator(`tr[data-secret="good-name-${s}"] td.version`)).toHaveText("1");
  check();
});

test("a reader, and a server without a key-encryption key, are told plainly why no secret is shown", async ({ page }) => {
  test.setTimeout(150_000);
  const check = guardPage(page);
  await openWithToken(page, stack, stack.token("reader"), "/secrets");
  const refusal = page.getByRole("alert");
  await expect(refusal).toContainText("reader may not call /composer.v1.SecretService/ListSecrets");
  await expect(refusal).toContainText("operator or admin token");
  await expect(page.getByRole("button", { name: "Set secret" })).toHaveCount(0);
  await expect(page.getByRole("table")).toHaveCount(0);

  const keyless = new Stack();
  try {
    await keyless.start();
    await openWithToken(page, keyless, keyless.token("admin"), "/secrets");
    await expect(page.getByRole("alert")).toContainText("this server has no secrets key-encryption key (--secrets-key-file)");
    await expect(page.getByRole("button", { name: "Set secret" })).toHaveCount(0);
    await expect(page.getByRole("table")).toHaveCount(0);
    expect(await seriousViolations(page)).toEqual([]);
  } finally {
    await keyless.stop();
  }
  check();
});

test("secrets are listed by name, a page at a time", async ({ page }) => {
  const check = guardPage(page);
  const token = stack.token("operator", { namespace: `paged-${hex()}` });
  const names = Array.from({ length: 12 }, (_, i) => `key-${String(i).padStart(2, "0")}`);
  for (const name of [...names].reverse()) stack.cli(["secret", "set", name], token, `value of ${name}`);

  await openWithToken(page, stack, token, "/secrets");
  const shown = page.locator("tbody tr td.name");
  await expect(shown).toHaveText(names.slice(0, 12));
  await page.getByLabel("Per page").selectOption("10");
  await expect(shown).toHaveText(names.slice(0, 10));
  await expect(page.getByRole("button", { name: "Previous page" })).toBeDisabled();
  await page.getByRole("button", { name: "Next page" }).click();
  await expect(shown).toHaveText(names.slice(10));
  await expect(page.getByText("Page 2")).toBeVisible();
  await expect(page.getByRole("button", { name: "Next page" })).toBeDisabled();
  await page.getByRole("button", { name: "Previous page" }).click();
  await expect(shown).toHaveText(names.slice(0, 10));
  check();
});
