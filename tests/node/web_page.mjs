// Headless Chromium (puppeteer-core, the system's chromium) on tandem-server's
// web page: the page loads with nothing fetched from anywhere else, the
// heatmap has one cell per (layer, expert), a chat streams its reply token
// by token, and the live view picks up the request. Input: TANDEM_E2E =
// {"base_url", "chromium", "prompt", "max_tokens", "layers", "experts"};
// prints one JSON object of what it saw (tests/http_web_page_test.cc checks it).
import puppeteer from "puppeteer-core";

const input = JSON.parse(process.env.TANDEM_E2E);
const browser = await puppeteer.launch({
  executablePath: input.chromium,
  headless: true,
  // root in a container: no sandbox; no GPU, and /dev/shm may be small.
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
});
const out = { errors: [], requests: [] };
try {
  const page = await browser.newPage();
  page.on("request", (r) => out.requests.push(r.url()));
  page.on("pageerror", (e) => out.errors.push(String(e)));
  page.on("console", (m) => { if (m.type() === "error") out.errors.push(m.text()); });

  const response = await page.goto(input.base_url + "/", { waitUntil: "load" });
  out.status = response.status();
  out.title = await page.title();

  // The heatmap: built from the first /v1/tandem/placement answer.
  const cells = input.layers * input.experts;
  await page.waitForFunction((n) => document.querySelectorAll("#heatmap .cell").length === n, { timeout: 30000 },
                             cells);
  out.cells = await page.$$eval("#heatmap .cell",
                                (all) => all.map((c) => [Number(c.dataset.layer), Number(c.dataset.expert)]));
  out.gpu_cells_before = await page.$$eval("#heatmap .cell.gpu", (all) => all.length);
  out.plots = await page.$$eval("#plots canvas", (all) => all.length);

  // A chat, greedy, streamed: the page keeps every content delta it parsed.
  await page.$eval("#max-tokens", (el, v) => { el.value = v; }, String(input.max_tokens));
  await page.$eval("#temperature", (el) => { el.value = "0"; });
  await page.type("#prompt", input.prompt);
  await page.click("#send");
  await page.waitForFunction(() => ["done", "error"].includes(document.getElementById("transcript").dataset.state),
                             { timeout: 120000 });
  out.chat_state = await page.$eval("#transcript", (el) => el.dataset.state);
  out.transcript = await page.$eval("#transcript", (el) => el.textContent);
  out.chunks = await page.evaluate(() => window.tandem.chunks);
  out.reply = await page.evaluate(() => {
    const m = window.tandem.messages;
    return m.length && m[m.length - 1].role === "assistant" ? m[m.length - 1].content : null;
  });
  out.pieces = await page.evaluate(() => window.tandem.pieces);
  out.shown = await page.$$eval("#transcript .msg-assistant", (all) => all.map((s) => s.textContent));
  out.chat_stats = await page.$eval("#chat-stats", (el) => el.textContent);

  // The live view after the request: the poll sees its tokens and runs.
  await page.waitForFunction(() => window.tandem.lastPlacement && window.tandem.lastPlacement.generated_tokens > 0,
                             { timeout: 30000 });
  // The plots need two samples for a line: polls come every second when idle.
  await page.waitForFunction(() => window.tandem.history.length >= 2, { timeout: 30000 });
  // One synchronous read of both, so that no poll lands between them.
  Object.assign(out, await page.evaluate(() => ({
    placement: window.tandem.lastPlacement,
    gpu_cells: document.querySelectorAll("#heatmap .cell.gpu").length,
    // A slot whose copy is still in flight is used, and drawn as migrating.
    slot_cells: document.querySelectorAll("#heatmap .cell.gpu, #heatmap .cell.migrating").length,
  })));
  out.cell_titles = await page.$$eval("#heatmap .cell", (all) => all.slice(0, 3).map((c) => c.title));
  out.layer_rows = await page.$$eval("#layers tbody tr", (all) => all.length);
  out.history = await page.evaluate(() => window.tandem.history.length);
} catch (e) {
  out.errors.push("driver: " + (e && e.stack ? e.stack : String(e)));
} finally {
  await browser.close();
}
out.external = out.requests.filter((u) => !u.startsWith(input.base_url));
console.log(JSON.stringify(out));
