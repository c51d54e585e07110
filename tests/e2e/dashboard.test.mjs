// End-to-end test of the dashboard (`GET /`) in headless Chromium.
//
// Run from the repository root, after `cargo build`:
//
//     npm ci --prefix tests/e2e && node --test tests/e2e/
//
// It builds nothing: it starts `target/debug/inhook serve` (or $INHOOK_BIN) on a
// random port with a temporary SQLite database and the two seed sources (and a
// `kind = "json"` source for the aggregates view), drives
// the page with playwright-core on the system's Chromium ($CHROMIUM, default
// /usr/bin/chromium), and writes screenshots of the main views to
// docs/screenshots/ (set INHOOK_SCREENSHOTS=0 to skip them, or to a directory).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { createServer } from 'node:http';
import { mkdtempSync, mkdirSync, writeFileSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = path.resolve(ROOT, process.env.INHOOK_BIN || 'target/debug/inhook');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SHOTS = process.env.INHOOK_SCREENSHOTS === '0' ? null
  : path.resolve(ROOT, process.env.INHOOK_SCREENSHOTS || 'docs/screenshots');

const ADMIN_TOKEN = 'e2e-admin-token-3f9a';
const PRESENCE_SECRET = 'presence-e2e-secret';
const SAVE_SECRET = 'save-e2e-secret';
const CRM_SECRET = 'crm-e2e-secret';
const ORDERS_SECRET = 'orders-e2e-secret';
const DEST_SECRET = `whsec_${Buffer.from('e2e-destination-secret').toString('base64')}`;
const WAIT = 15_000;

// ------------------------------------------------------------------ the server

/**
 * Starts `inhook serve` with the seed sources, plus with `json` a `kind = "json"` source
 * `crm` (latest-wins, keyed by org and user id, `email` masked), plus `extra` (more
 * configuration); resolves once it prints its address.
 */
async function startServer({ adminToken, json = false, extra = '', generated = false, top = '' }) {
  const dir = mkdtempSync(path.join(tmpdir(), 'inhook-e2e-'));
  const crm = `
[[sources]]
name = "crm"
kind = "json"
mode = "sync"
signature = "github"
secrets = ["${CRM_SECRET}"]
event_id = "/id"
event_type = "/type"
aggregate = ["/org", "/user/id"]
sequence = "/version"
ordering = "latest-wins"
state = "/user"
`;
  const config = `
listen = "127.0.0.1:0"
database = "sqlite://${path.join(dir, 'inhook.db')}"
${adminToken ? `admin_token = "${adminToken}"` : (generated ? '' : 'admin_open_to_loopback = true')}
${json ? 'mask_fields = ["email"]' : ''}
${top}

[[sources]]
name = "presence"
kind = "presence"
mode = "sync"
signature = "hmac-hex"
secrets = ["${PRESENCE_SECRET}"]

[[sources]]
name = "save-game"
kind = "save-game"
mode = "async"
signature = "hmac-timestamped"
tolerance_s = 300
secrets = ["${SAVE_SECRET}"]
${json ? crm : ''}
${extra}`;
  const configPath = path.join(dir, 'inhook.toml');
  writeFileSync(configPath, config);
  assert.ok(existsSync(BIN), `${BIN} is missing: run \`cargo build\` first (or set INHOOK_BIN)`);
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('INHOOK_')));
  const logPath = path.join(dir, 'server.log');
  const child = spawn(BIN, ['serve', '--config', configPath], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  const log = [];
  child.stderr.on('data', (chunk) => log.push(chunk));
  const printed = [];
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('inhook did not start within 20 s')), 20_000);
    const lines = createInterface({ input: child.stdout });
    lines.on('line', (line) => printed.push(line));
    lines.once('line', (line) => {
      clearTimeout(timer);
      const m = /^inhook listening on (http:\/\/\S+)$/.exec(line.trim());
      if (m) resolve(m[1]); else reject(new Error(`unexpected first line ${JSON.stringify(line)}`));
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`inhook exited with ${code}: ${Buffer.concat(log).toString()}`));
    });
  });
  child.stdout.resume();
  return {
    url,
    dir,
    printed,
    log: () => Buffer.concat(log).toString(),
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once('exit', r));
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
        await exited;
        clearTimeout(timer);
      }
      writeFileSync(logPath, this.log());
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

const hmacHex = (secret, data) => createHmac('sha256', secret).update(data).digest('hex');

/** Posts a presence event signed with hmac-hex (X-Signature over the raw body). */
async function postPresence(server, event) {
  const body = JSON.stringify(event);
  const res = await fetch(`${server.url}/webhooks/presence`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-Signature': hmacHex(PRESENCE_SECRET, body) },
    body,
  });
  return { code: res.status, body: await res.json() };
}

/** Posts a save-game event signed with hmac-timestamped (X-Signature over "{ts}.{body}"). */
async function postSave(server, event) {
  const body = JSON.stringify(event);
  const ts = Math.floor(Date.now() / 1000);
  const res = await fetch(`${server.url}/webhooks/save-game`, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/json',
      'X-Timestamp': String(ts),
      'X-Signature': hmacHex(SAVE_SECRET, `${ts}.${body}`),
    },
    body,
  });
  return { code: res.status, body: await res.json() };
}

/** Posts to a `signature = "github"` source (X-Hub-Signature-256 over the raw body). */
async function postGithubSigned(server, source, secret, event) {
  const body = JSON.stringify(event);
  const res = await fetch(`${server.url}/webhooks/${source}`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-Hub-Signature-256': `sha256=${hmacHex(secret, body)}` },
    body,
  });
  return { code: res.status, body: await res.json() };
}

/** Posts to the json source `crm`. */
const postCrm = (server, event) => postGithubSigned(server, 'crm', CRM_SECRET, event);

/** A `crm` event: the aggregate is (org, user.id), the kept state is `user`. */
function crmEvent(id, org, version, user) {
  return { id, type: 'contact.updated', org, version, user };
}

/** GETs the admin API with the token. */
async function apiGet(server, p) {
  const res = await fetch(`${server.url}${p}`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
  return { code: res.status, body: res.headers.get('content-type')?.includes('json') ? await res.json() : null };
}

async function waitFor(what, probe, timeout = WAIT) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    last = await probe();
    if (last.ok) return last.value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: last ${JSON.stringify(last.value)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function eventStatus(server, source, id) {
  return waitFor(`${id}`, async () => {
    const r = await apiGet(server, `/v1/events/${source}/${encodeURIComponent(id)}`);
    return { ok: r.code === 200, value: r.body };
  });
}

function saveEvent(id, type, seq, data) {
  return {
    event_id: id, event_type: type, payload_version: 1, occurred_at: new Date().toISOString(),
    player_id: 'player_1024', save_slot: 'slot_a', sequence: seq, idempotency_key: `player_1024:slot_a:${id}`, data,
  };
}

// ------------------------------------------------------------------ the browser

async function launch() {
  const profile = mkdtempSync(path.join(tmpdir(), 'inhook-e2e-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
    viewport: { width: 1280, height: 800 },
    deviceScaleFactor: 1,
    colorScheme: 'light',
    locale: 'en-US',
    timezoneId: 'UTC',
  });
  return {
    context,
    async close() {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

/**
 * Collects page errors, failed console messages (CSP violations among them) and XSS probes;
 * a dialog is one too, unless it is a confirm matching `accept`, which is accepted and kept in `dialogs`.
 */
function watch(page, { accept = null, dialogs = [] } = {}) {
  const problems = [];
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('console', (msg) => {
    if (msg.type() === 'error' && !/Failed to load resource: the server responded with a status of (401|404)/.test(msg.text())) {
      problems.push(`console error: ${msg.text()}`);
    }
  });
  page.on('dialog', (dialog) => {
    if (accept && dialog.type() === 'confirm' && accept.test(dialog.message())) {
      dialogs.push(dialog.message());
      dialog.accept();
      return;
    }
    problems.push(`unexpected dialog: ${dialog.message()}`);
    dialog.dismiss();
  });
  return problems;
}

async function shot(page, name, opts = {}) {
  if (!SHOTS) return;
  mkdirSync(SHOTS, { recursive: true });
  await page.evaluate(() => document.activeElement && document.activeElement.blur());
  await page.evaluate(() => document.getElementById('toasts').replaceChildren());
  // `animations: 'disabled'` finishes the row highlights before the picture is taken.
  await page.screenshot({ path: path.join(SHOTS, `${name}.png`), animations: 'disabled', ...opts });
}

/** Waits until `selector` contains every string of `texts`. */
async function waitText(page, selector, texts, timeout = WAIT) {
  await page.waitForFunction(([sel, want]) => {
    const el = document.querySelector(sel);
    return !!el && want.every((t) => el.textContent.includes(t));
  }, [selector, [].concat(texts)], { timeout });
}

async function noHorizontalScroll(page) {
  return page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth);
}

// ------------------------------------------------------------------ the scenario

test('dashboard: log in, follow events, triage and replay a dead letter, watch state change', async (t) => {
  const server = await startServer({ adminToken: ADMIN_TOKEN });
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await server.stop();
  });
  const page = browser.context.pages()[0] || await browser.context.newPage();
  const problems = watch(page);

  await t.test('the page is served without a token, with a strict policy', async () => {
    const res = await fetch(`${server.url}/`);
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /text\/html/);
    const csp = res.headers.get('content-security-policy') || '';
    assert.match(csp, /default-src 'none'/);
    assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval/);
    const denied = await fetch(`${server.url}/v1/events`);
    assert.equal(denied.status, 401, 'the data itself needs the token');
  });

  await t.test('a wrong token is refused, the right one logs in', async () => {
    await page.goto(server.url + '/');
    await page.locator('#login').waitFor();
    await page.fill('#token', 'not-the-token');
    await page.click('#login-button');
    await waitText(page, '#login-error', 'refused');
    assert.equal(await page.isVisible('#tabs'), false);
    await page.fill('#token', ADMIN_TOKEN);
    await page.click('#login-button');
    await page.locator('#tabs').waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem('inhook.token')), ADMIN_TOKEN);
    await page.locator('.card[data-source="presence"]').waitFor();
    await page.locator('.card[data-source="save-game"]').waitFor();
    await page.waitForFunction(() => document.getElementById('live-label').textContent === 'live', null, { timeout: WAIT });
  });

  await t.test('a presence event appears in the event log and opens in detail', async () => {
    const online = { event_id: 'evt_presence_0001', user_id: 'usr_ada', presence: 'ONLINE', sequence_number: 1, timestamp: Math.floor(Date.now() / 1000) };
    assert.equal((await postPresence(server, online)).body.status, 'applied');
    assert.equal((await postPresence(server, { ...online, event_id: 'evt_presence_0002', presence: 'BUSY', sequence_number: 2 })).body.status, 'applied');
    assert.equal((await postPresence(server, { ...online, event_id: 'evt_presence_0003', user_id: 'usr_grace', presence: 'AWAY', sequence_number: 7 })).body.status, 'applied');
    assert.equal((await postPresence(server, online)).body.status, 'duplicate');
    assert.equal((await postPresence(server, { ...online, event_id: 'evt_presence_0004', presence: 'OFFLINE', sequence_number: 1 })).body.status, 'stale');

    await page.click('#tabs a[data-tab="events"]');
    await waitText(page, '#events-body', ['evt_presence_0001', 'evt_presence_0004', 'usr_grace']);
    const row = page.locator('#events-body tr', { hasText: 'evt_presence_0001' });
    assert.match(await row.innerText(), /processed/);
    assert.match(await page.locator('#events-body tr', { hasText: 'evt_presence_0004' }).innerText(), /ignored stale/);

    // Filters: by status, then back.
    await page.selectOption('#event-filters select[name="status"]', 'ignored_stale');
    await page.waitForFunction(() => document.querySelectorAll('#events-body tbody tr').length === 1, null, { timeout: WAIT });
    await page.click('#events-reset');
    await waitText(page, '#events-body', ['evt_presence_0001', 'evt_presence_0003']);

    await row.click();
    await page.locator('#detail').waitFor();
    await waitText(page, '#detail-body', ['usr_ada', 'ONLINE', 'History', 'Headers']);
    assert.equal(await page.textContent('#detail-title'), 'evt_presence_0001');
    const detail = await apiGet(server, '/v1/events/presence/evt_presence_0001');
    if (detail.body && detail.body.headers) {
      await waitText(page, '#detail-body', Object.keys(detail.body.headers).slice(0, 2));
    } else {
      await waitText(page, '#detail-body', 'Headers unavailable');
      t.diagnostic('GET /v1/events/{source}/{event_id} has no "headers" field yet');
    }
    await page.keyboard.press('Escape');
    await page.locator('#detail').waitFor({ state: 'hidden' });
  });

  await t.test('a delta that removes what the slot lacks dies, and a replay after a grant applies it', async () => {
    assert.equal((await postSave(server, saveEvent('sg_progress_1', 'progress.saved', 1, { chapter: 3, checkpoint: 'lighthouse', playtime_s: 5400 }))).code, 202);
    assert.equal((await postSave(server, saveEvent('sg_take_2', 'inventory.updated', 2, { reason: 'crafting', removed_items: [{ item_id: 'pressed_flower', qty: 2 }] }))).code, 202);
    const dead = await waitFor('sg_take_2 dead', async () => {
      const r = await apiGet(server, '/v1/events/save-game/sg_take_2');
      return { ok: r.body?.status === 'dead', value: r.body };
    });
    assert.equal(dead.dead_reason, 'insufficient_quantity');
    assert.equal((await postSave(server, saveEvent('sg_grant_3', 'inventory.updated', 3, { reason: 'chapter_reward', chapter: 3, added_items: [{ item_id: 'pressed_flower', qty: 3 }, { item_id: 'lantern_oil', qty: 2 }] }))).code, 202);
    assert.equal((await postSave(server, saveEvent('sg_badge_4', 'achievement.unlocked', 4, { achievement_id: 'first_bloom' }))).code, 202);
    await waitFor('sg_badge_4 processed', async () => {
      const r = await apiGet(server, '/v1/events/save-game/sg_badge_4');
      return { ok: r.body?.status === 'processed', value: r.body };
    });

    // The log shows it dead, with its reason; its detail says why.
    await page.click('#tabs a[data-tab="events"]');
    await waitText(page, '#events-body', ['sg_badge_4', 'sg_take_2', 'insufficient_quantity']);
    await shot(page, 'event-log');
    await page.locator('#events-body tr', { hasText: 'sg_take_2' }).click();
    await waitText(page, '#detail-body', ['insufficient_quantity', 'pressed_flower', 'content-type']);
    assert.equal(await page.locator('#detail button[data-action="replay"]').count(), 1);
    await shot(page, 'event-detail');
    await page.keyboard.press('Escape');

    await page.click('#tabs a[data-tab="dead"]');
    const row = page.locator('#dead-body tr', { hasText: 'sg_take_2' });
    await row.waitFor();
    assert.match(await row.innerText(), /insufficient_quantity/);
    await page.waitForFunction(() => document.getElementById('dead-count').textContent === '1', null, { timeout: WAIT });
    await shot(page, 'dead-letters');

    await row.locator('button[data-action="replay"]').click();
    await page.waitForFunction(() => {
      const tr = [...document.querySelectorAll('#dead-body tr')].find((r) => r.textContent.includes('sg_take_2'));
      return tr && tr.textContent.includes('processed');
    }, null, { timeout: WAIT });
    const replayed = await apiGet(server, '/v1/events/save-game/sg_take_2');
    assert.equal(replayed.body.status, 'processed');
    assert.equal(replayed.body.replays, 1);
    const save = await apiGet(server, '/v1/saves/player_1024/slot_a');
    assert.deepEqual(save.body.inventory, { pressed_flower: 1, lantern_oil: 2 });
  });

  await t.test('the aggregates view shows the current state, updated live', async () => {
    await page.click('#tabs a[data-tab="aggregates"]');
    await waitText(page, '#presence-body', ['usr_ada', 'BUSY', 'usr_grace', 'AWAY']);
    await waitText(page, '#saves-body', ['player_1024', 'slot_a', 'pressed_flower', '×1', 'lantern_oil', 'first_bloom']);
    // A change while the view is open arrives through the stream.
    assert.equal((await postPresence(server, { event_id: 'evt_presence_0005', user_id: 'usr_ada', presence: 'AWAY', sequence_number: 3 })).body.status, 'applied');
    await page.waitForFunction(() => {
      const tr = [...document.querySelectorAll('#presence-body tr')].find((r) => r.textContent.includes('usr_ada'));
      return tr && tr.textContent.includes('AWAY');
    }, null, { timeout: WAIT });
    // The list of the first source (presence) follows it too, in its generic shape.
    await page.waitForFunction(() => {
      const tr = document.querySelector('#agg-body tr[data-key="usr_ada"]');
      return tr && tr.textContent.includes('AWAY') && tr.textContent.includes('presence.changed');
    }, null, { timeout: WAIT });
    await shot(page, 'aggregates');
  });

  await t.test('the live stream lists the latest changes', async () => {
    await page.click('#tabs a[data-tab="stream"]');
    await waitText(page, '#stream-body', ['usr_ada', 'player_1024/slot_a', 'first_bloom']);
    await waitText(page, '#stream-state', ['connected', 'last event id']);
    await shot(page, 'stream');
  });

  await t.test('the overview counts per source', async () => {
    await page.click('#tabs a[data-tab="overview"]');
    const want = {
      presence: { received: '5', processed: '4', stale: '1', duplicates: '1', dead: '0' },
      'save-game': { received: '4', processed: '4', dead: '0', held: '0', backlog: '0' },
    };
    // Counters refresh every 2 s: wait for a refresh that has seen every event.
    await page.waitForFunction((expected) => Object.entries(expected).every(([source, counters]) =>
      Object.entries(counters).every(([key, value]) => {
        const v = document.querySelector(`.card[data-source="${source}"] [data-counter="${key}"] .v`);
        return v && v.textContent === value;
      })), want, { timeout: WAIT });
    await shot(page, 'overview');
  });

  await t.test('on a 390 px phone nothing scrolls sideways but tables', async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    for (const tab of ['overview', 'events', 'dead', 'aggregates', 'stream']) {
      await page.click(`#tabs a[data-tab="${tab}"]`);
      await page.waitForTimeout(300);
      assert.ok(await noHorizontalScroll(page), `${tab} scrolls sideways at 390 px`);
      if (process.env.INHOOK_PHONE_SHOTS) { // every view at phone size, for a look
        mkdirSync(process.env.INHOOK_PHONE_SHOTS, { recursive: true });
        await page.screenshot({ path: path.join(process.env.INHOOK_PHONE_SHOTS, `${tab}.png`), fullPage: true });
      }
    }
    await page.click('#tabs a[data-tab="events"]');
    await waitText(page, '#events-body', 'evt_presence_0005');
    await shot(page, 'phone-event-log');
    await page.locator('#events-body tr', { hasText: 'sg_take_2' }).click();
    await waitText(page, '#detail-body', ['pressed_flower', 'replayed']);
    assert.ok(await noHorizontalScroll(page), 'the detail scrolls sideways at 390 px');
    await page.keyboard.press('Escape');
    await page.click('#tabs a[data-tab="overview"]');
    await page.locator('.card[data-source="presence"]').waitFor();
    await shot(page, 'phone-overview');
    await page.setViewportSize({ width: 1280, height: 800 });
  });

  await t.test('publisher strings are shown as text, never run as markup', async () => {
    const probe = '<img src=x onerror=window.__xss=1>';
    assert.equal((await postPresence(server, { event_id: 'evt_<b>bold</b>', user_id: probe, presence: 'ONLINE', sequence_number: 1 })).body.status, 'applied');
    await page.click('#tabs a[data-tab="events"]');
    await waitText(page, '#events-body', [probe, 'evt_<b>bold</b>']);
    await page.locator('#events-body tr', { hasText: 'evt_<b>bold</b>' }).click();
    await waitText(page, '#detail-body', probe);
    await page.keyboard.press('Escape');
    await page.click('#tabs a[data-tab="aggregates"]');
    await waitText(page, '#presence-body', probe);
    assert.equal(await page.evaluate(() => window.__xss), undefined);
    assert.equal(await page.evaluate(() => document.querySelectorAll('main img, #detail img').length), 0);
    assert.equal(await page.evaluate(() => [...document.querySelectorAll('b')].some((b) => b.textContent === 'bold')), false);
  });

  await t.test('the log pages with More', async () => {
    const bulk = [];
    for (let i = 0; i < 55; i++) {
      bulk.push(postPresence(server, { event_id: `evt_bulk_${i}`, user_id: `usr_bulk_${i % 5}`, presence: 'ONLINE', sequence_number: 100 + i }));
    }
    for (const r of await Promise.all(bulk)) assert.equal(r.code, 200);
    await page.click('#tabs a[data-tab="events"]');
    await waitText(page, '#events-body', 'evt_bulk_');
    await page.locator('#events-more').waitFor();
    assert.equal(await page.locator('#events-body tbody tr').count(), 50);
    const total = (await apiGet(server, '/v1/events?limit=500')).body.items.length;
    assert.ok(total > 50 && total <= 100, `${total} events`);
    await page.click('#events-more');
    await page.waitForFunction((n) => document.querySelectorAll('#events-body tbody tr').length === n, total, { timeout: WAIT });
    await page.locator('#events-more').waitFor({ state: 'hidden' });
    // A live refresh keeps every loaded row.
    await page.waitForTimeout(2500);
    assert.equal(await page.locator('#events-body tbody tr').count(), total);
  });

  await t.test('a token the server stops accepting sends you back to log in', async () => {
    await page.evaluate(() => sessionStorage.setItem('inhook.token', 'an-old-token'));
    await page.reload();
    await page.locator('#login').waitFor();
    await waitText(page, '#login-error', 'refused');
    await page.fill('#token', ADMIN_TOKEN);
    await page.click('#login-button');
    await page.locator('#tabs').waitFor();
  });

  await t.test('log out forgets the token', async () => {
    await page.click('#logout');
    await page.locator('#login').waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem('inhook.token')), null);
    await page.reload();
    await page.locator('#login').waitFor();
    assert.equal(await page.isVisible('#tabs'), false);
  });

  assert.deepEqual(problems, [], 'no page errors, console errors or dialogs');
});

test('dashboard: the aggregates view reads every source, json ones included', async (t) => {
  const server = await startServer({ adminToken: ADMIN_TOKEN, json: true });
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await server.stop();
  });
  const page = browser.context.pages()[0] || await browser.context.newPage();
  const problems = watch(page);
  // Every aggregate read the page makes, as the server sees its path.
  const reads = [];
  page.on('request', (req) => {
    const url = new URL(req.url());
    if (url.pathname.startsWith('/v1/sources/')) reads.push(url.pathname + url.search);
  });
  const rows = () => page.locator('#agg-body tbody tr');

  const ada = { id: 'ada', name: 'Ada Lovelace', email: 'ada@example.com', plan: 'free', seats: 1 };
  const alice = { id: 'team/alice', name: 'Alice', email: 'alice@example.com', plan: 'team', seats: 5 };
  assert.equal((await postCrm(server, crmEvent('crm_1', 'acme', 1, ada))).body.status, 'applied');
  assert.equal((await postCrm(server, crmEvent('crm_2', 'acme', 2, { ...ada, plan: 'pro', seats: 3 }))).body.status, 'applied');
  assert.equal((await postCrm(server, crmEvent('crm_3', 'acme', 1, { ...ada, plan: 'trial' }))).body.status, 'stale');
  assert.equal((await postCrm(server, crmEvent('crm_4', 'acme', 1, alice))).body.status, 'applied');
  assert.equal((await postCrm(server, crmEvent('crm_5', 'globex', 7, { id: 'grace', name: 'Grace', email: 'grace@example.com', plan: 'free', seats: 1 }))).body.status, 'applied');
  assert.equal((await postPresence(server, { event_id: 'evt_p1', user_id: 'usr_ada', presence: 'ONLINE', sequence_number: 1 })).body.status, 'applied');
  assert.equal((await postSave(server, saveEvent('sg_p1', 'progress.saved', 1, { chapter: 2 }))).code, 202);
  await waitFor('sg_p1 processed', async () => {
    const r = await apiGet(server, '/v1/events/save-game/sg_p1');
    return { ok: r.body?.status === 'processed', value: r.body };
  });

  await page.goto(server.url + '/');
  await page.fill('#token', ADMIN_TOKEN);
  await page.click('#login-button');
  await page.locator('.card[data-source="crm"]').waitFor();

  await t.test('every configured source can be picked, each kind listed by the same view', async () => {
    await page.click('#tabs a[data-tab="aggregates"]');
    await page.waitForFunction(() => document.querySelectorAll('#agg-source option').length === 3, null, { timeout: WAIT });
    assert.deepEqual(await page.$$eval('#agg-source option', (os) => os.map((o) => o.value)), ['presence', 'save-game', 'crm']);
    // The first source is shown until another is picked: presence, then a save slot's two-part key.
    await waitText(page, '#agg-body', 'usr_ada');
    await page.selectOption('#agg-source', 'save-game');
    await waitText(page, '#agg-body', ['player_1024/slot_a', 'progress.saved']);
    await rows().first().click();
    await waitText(page, '#detail-title', 'player_1024/slot_a');
    await waitText(page, '#aggregate-state', 'chapter');
    await page.keyboard.press('Escape');
  });

  await t.test('a json source lists its aggregates; one opens with its state, masked', async () => {
    await page.selectOption('#agg-source', 'crm');
    await waitText(page, '#agg-body', ['acme/ada', 'acme/team%2Falice', 'globex/grace', 'contact.updated']);
    assert.equal(await rows().count(), 3);
    const adaRow = rows().filter({ hasText: 'acme/ada' });
    assert.match(await adaRow.innerText(), /\b2\b/, 'the latest sequence, not the stale one');
    assert.doesNotMatch(await page.textContent('#agg-body'), /ada@example\.com/);
    await shot(page, 'aggregates-by-source');

    await adaRow.click();
    await page.locator('#detail').waitFor();
    await waitText(page, '#aggregate-state', ['"plan": "pro"', '"seats": 3', '"email": "***"']);
    const state = JSON.parse(await page.textContent('#aggregate-state'));
    assert.deepEqual(state, { id: 'ada', name: 'Ada Lovelace', email: '***', plan: 'pro', seats: 3 });
    assert.equal(await page.textContent('#detail-title'), 'acme/ada');
    await waitText(page, '#detail-body', ['crm', 'crm_2', 'contact.updated']);
    assert.equal((await page.textContent('#aggregate-state')).split('\n').length > 1, true, 'pretty-printed');
    await shot(page, 'aggregate-state');

    // Its last event opens in the same drawer, and leads back to the state.
    await page.click('#detail button[data-action="event"]');
    await waitText(page, '#detail-title', 'crm_2');
    await waitText(page, '#detail-body', ['processed', 'History']);
    await page.click('#detail button[data-action="state"]');
    await waitText(page, '#detail-title', 'acme/ada');
    await waitText(page, '#aggregate-state', '"plan": "pro"');
    await page.keyboard.press('Escape');
  });

  await t.test('a key holding / opens from the jump box, and its events from the drawer', async () => {
    // The filter narrows the loaded rows as you type.
    await page.fill('#agg-key', 'alice');
    await page.waitForFunction(() => document.querySelectorAll('#agg-body tbody tr').length === 1, null, { timeout: WAIT });
    await waitText(page, '#agg-info', '1 of 3 loaded match');
    // Enter opens the typed text form; its one `/` inside the id travels as %252F.
    await page.fill('#agg-key', 'acme/team%2Falice');
    await page.press('#agg-key', 'Enter');
    await waitText(page, '#detail-title', 'acme/team%2Falice');
    await waitText(page, '#aggregate-state', ['"id": "team/alice"', '"name": "Alice"', '"email": "***"']);
    assert.ok(reads.includes('/v1/sources/crm/aggregates/acme/team%252Falice'), JSON.stringify(reads));

    await page.click('#detail button[data-action="events"]');
    await page.locator('#detail').waitFor({ state: 'hidden' });
    await waitText(page, '#events-body', 'crm_4');
    assert.equal(await page.inputValue('#event-filters input[name="aggregate"]'), 'acme/team%2Falice');
    assert.equal(await page.inputValue('#event-filters select[name="source"]'), 'crm');
    assert.equal(await page.locator('#events-body tbody tr').count(), 1);

    // A key nobody sent says so.
    await page.click('#tabs a[data-tab="aggregates"]');
    await page.fill('#agg-key', 'acme/team/alice');
    await page.click('#agg-open');
    await waitText(page, '#detail-body', 'No aggregate acme/team/alice in crm');
    await page.keyboard.press('Escape');
    await page.fill('#agg-key', '');
  });

  await t.test('the list pages with More', async () => {
    const bulk = [];
    for (let i = 0; i < 60; i++) bulk.push(postCrm(server, crmEvent(`crm_bulk_${i}`, 'initech', 1, { id: `u${String(i).padStart(2, '0')}`, email: `u${i}@example.com` })));
    for (const r of await Promise.all(bulk)) assert.equal(r.body.status, 'applied');
    const total = (await apiGet(server, '/v1/sources/crm/aggregates?limit=500')).body.items.length;
    assert.equal(total, 63);
    // Picking the source again reads its first page.
    await page.selectOption('#agg-source', 'presence');
    await waitText(page, '#agg-body', 'usr_ada');
    await page.selectOption('#agg-source', 'crm');
    await page.waitForFunction(() => document.querySelectorAll('#agg-body tbody tr').length === 50, null, { timeout: WAIT });
    await page.locator('#agg-more').waitFor();
    await page.click('#agg-more');
    await page.waitForFunction((n) => document.querySelectorAll('#agg-body tbody tr').length === n, total, { timeout: WAIT });
    await page.locator('#agg-more').waitFor({ state: 'hidden' });
    const keys = await page.$$eval('#agg-body tbody tr', (trs) => trs.map((tr) => tr.dataset.key));
    assert.equal(new Set(keys).size, total, 'no row twice');
    for (const k of ['acme/ada', 'acme/team%2Falice', 'initech/u00', 'initech/u59']) assert.ok(keys.includes(k), k);
    // A refresh keeps every loaded row.
    await page.waitForTimeout(2500);
    assert.equal(await rows().count(), total);
  });

  await t.test('a change of the shown source appears without a reload', async () => {
    assert.equal((await postCrm(server, crmEvent('crm_6', 'acme', 3, { ...ada, plan: 'enterprise', seats: 40 }))).body.status, 'applied');
    await page.waitForFunction(() => {
      const tr = document.querySelector('#agg-body tr[data-key="acme/ada"]');
      return tr && tr.textContent.includes('enterprise');
    }, null, { timeout: WAIT });    // The live stream shows it too: key, sequence, type and the masked state.
    await page.click('#tabs a[data-tab="stream"]');
    await waitText(page, '#stream-body li[data-kind="json"]', ['acme/ada', 'seq 3', 'contact.updated', 'plan: enterprise', 'email: ***']);
    assert.doesNotMatch(await page.textContent('#stream-body'), /@example\.com/);
    await page.click('#tabs a[data-tab="aggregates"]');
    await page.locator('#agg-body tr[data-key="acme/ada"]').waitFor();
  });

  await t.test('on a 390 px phone the view does not scroll sideways', async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    await page.waitForTimeout(300);
    assert.ok(await noHorizontalScroll(page), 'aggregates scroll sideways at 390 px');
    await rows().filter({ hasText: 'acme/team%2Falice' }).click();
    await waitText(page, '#aggregate-state', 'team/alice');
    assert.ok(await noHorizontalScroll(page), 'the aggregate drawer scrolls sideways at 390 px');
    await page.keyboard.press('Escape');
    await page.setViewportSize({ width: 1280, height: 800 });
  });

  assert.deepEqual(problems, [], 'no page errors, console errors or dialogs');
});

test('dashboard: the event log searches by what events say, by type and by id', async (t) => {
  const SHOP_SECRET = 'shop-e2e-secret';
  const shop = `
[[sources]]
name = "shop"
kind = "json"
mode = "sync"
signature = "github"
secrets = ["${SHOP_SECRET}"]
event_id = "/id"
event_type = "/type"
aggregate = "/invoice"
sequence = "/version"
ordering = "latest-wins"
state = "/data"
search_fields = ["/data/customer"]
`;
  const server = await startServer({ adminToken: ADMIN_TOKEN, extra: shop });
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await server.stop();
  });
  const page = browser.context.pages()[0] || await browser.context.newPage();
  const problems = watch(page);
  // Every event-log read the page makes, as the server sees it.
  const reads = [];
  page.on('request', (req) => {
    const url = new URL(req.url());
    if (url.pathname === '/v1/events') reads.push(url.search);
  });
  const post = (id, type, invoice, customer, note) => postGithubSigned(server, 'shop', SHOP_SECRET,
    { id, type, invoice, version: 1, data: { customer, note } });
  assert.equal((await post('sh_1', 'invoice.created', 'in_1', 'cus_1', 'first')).body.status, 'applied');
  assert.equal((await post('sh_2', 'invoice.paid', 'in_2', 'cus_1', 'second')).body.status, 'applied');
  assert.equal((await post('sh_3', 'charge.succeeded', 'in_3', 'cus_2', 'third')).body.status, 'applied');

  await page.goto(server.url + '/');
  await page.fill('#token', ADMIN_TOKEN);
  await page.click('#login-button');
  await page.locator('#tabs').waitFor();
  await page.click('#tabs a[data-tab="events"]');
  await waitText(page, '#events-body', ['sh_1', 'sh_2', 'sh_3']);
  const waitRows = (n) => page.waitForFunction((want) => document.querySelectorAll('#events-body tbody tr').length === want, n, { timeout: WAIT });
  // Exactly the rows of these event ids, in this order.
  const waitOnly = (ids) => page.waitForFunction((want) => {
    const rows = [...document.querySelectorAll('#events-body tbody tr')];
    return rows.length === want.length && rows.every((r, i) => r.textContent.includes(want[i]));
  }, ids, { timeout: WAIT });

  await t.test('a /pointer=value finds the events whose body holds it', async () => {
    await page.fill('#events-search', '/data/customer=cus_1');
    await waitOnly(['sh_2', 'sh_1']);
    assert.ok(reads.some((q) => new URLSearchParams(q).get('where') === '/data/customer=cus_1'), reads.join('|'));
    await shot(page, 'event-search');
  });

  await t.test('with a type pattern beside it, both hold', async () => {
    await page.fill('#event-filters input[name="type"]', 'invoice.p*');
    await waitOnly(['sh_2']);
  });

  await t.test('any other text is an event id; an undeclared field is scanned', async () => {
    await page.fill('#event-filters input[name="type"]', '');
    await page.fill('#events-search', 'sh_3');
    await waitOnly(['sh_3']);
    assert.ok(reads.some((q) => new URLSearchParams(q).get('event_id') === 'sh_3'), reads.join('|'));
    await page.fill('#events-search', '/data/note=first');
    await waitOnly(['sh_1']);
  });

  await t.test('a search that is not valid says why', async () => {
    await page.fill('#event-filters input[name="type"]', 'in*voice');
    await waitText(page, '#events-body', 'may only end');
    await page.click('#events-reset');
    await waitOnly(['sh_3', 'sh_2', 'sh_1']);
  });
  assert.deepEqual(problems.filter((p) => !/status of 400/.test(p)), []);
});

test('dashboard: with no admin_token, an empty token works from loopback', async (t) => {
  const server = await startServer({ adminToken: null });
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await server.stop();
  });
  const page = browser.context.pages()[0] || await browser.context.newPage();
  const problems = watch(page);
  await page.goto(server.url + '/');
  await page.locator('#login').waitFor();
  await page.click('#login-button');
  await page.locator('#tabs').waitFor();
  await page.locator('.card[data-source="save-game"]').waitFor();
  assert.equal(await page.evaluate(() => sessionStorage.getItem('inhook.token')), '');
  await page.click('#tabs a[data-tab="destinations"]');
  await waitText(page, '#dest-body', 'No destinations configured');
  assert.equal(await page.isVisible('#dlv-panel'), false);
  assert.deepEqual(problems, []);
});

test('dashboard: the link inhook serve prints for a generated token logs in, and leaves the address bar', async (t) => {
  const server = await startServer({ adminToken: null, generated: true });
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await server.stop();
  });
  const deadline = Date.now() + 5000;
  let link;
  while (!(link = server.printed.find((l) => l.startsWith('inhook dashboard: ')))) {
    assert.ok(Date.now() < deadline, `no dashboard link in ${JSON.stringify(server.printed)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const href = link.slice('inhook dashboard: '.length);
  const token = href.split('#token=')[1];
  assert.ok(token && token.length >= 32, href);
  const page = browser.context.pages()[0] || await browser.context.newPage();
  const problems = watch(page);
  // Without the token, loopback alone is refused.
  const refused = await page.request.get(server.url + '/v1/events');
  assert.equal(refused.status(), 401);
  await page.goto(href);
  await page.locator('#tabs').waitFor();
  await page.locator('.card[data-source="save-game"]').waitFor();
  assert.equal(await page.evaluate(() => location.hash), '');
  assert.equal(await page.evaluate(() => sessionStorage.getItem('inhook.token')), token);
  assert.ok(!server.log().includes(token), 'the token reached the log');
  assert.deepEqual(problems, []);
});

test('dashboard: degrades without the newer routes, and resumes the stream with Last-Event-ID', async (t) => {
  const server = await startServer({ adminToken: ADMIN_TOKEN });
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await server.stop();
  });
  const page = browser.context.pages()[0] || await browser.context.newPage();
  const problems = watch(page);
  const notFound = (route) => route.fulfill({ status: 404, body: '' });
  await page.route((url) => url.pathname === '/v1/overview', notFound);
  await page.route((url) => url.pathname === '/v1/saves', notFound);
  await page.route((url) => url.pathname.startsWith('/v1/sources/'), notFound);
  await page.route((url) => url.pathname.startsWith('/v1/destinations'), notFound);
  // The first stream ends after one event (CRLF lines, a comment, data over two lines);
  // the reconnection must carry its id and the token; then the route is gone (404).
  const streamRequests = [];
  await page.route((url) => url.pathname === '/v1/stream', (route) => {
    streamRequests.push(route.request().headers());
    if (streamRequests.length > 1) return notFound(route);
    return route.fulfill({
      status: 200,
      headers: { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' },
      body: ': hello\r\nretry: 300\r\nid: 41\r\nevent: presence\r\n'
        + 'data: {"source":"presence","aggregate":"usr_canned",\r\n'
        + 'data: "state":{"user_id":"usr_canned","status":"BUSY","sequence":9,"updated_at":"2026-01-01T00:00:00Z","stale":false}}\r\n\r\n',
    });
  });
  await page.goto(server.url + '/');
  await page.fill('#token', ADMIN_TOKEN);
  await page.click('#login-button');
  await page.locator('#tabs').waitFor();
  await waitText(page, '#overview-body', 'Counters unavailable');

  await page.click('#tabs a[data-tab="stream"]');
  await waitText(page, '#stream-body', ['usr_canned', 'BUSY']);
  await waitText(page, '#stream-state', 'unavailable');
  assert.equal(streamRequests.length, 2);
  assert.equal(streamRequests[0].authorization, `Bearer ${ADMIN_TOKEN}`);
  assert.equal(streamRequests[0]['last-event-id'], undefined);
  assert.equal(streamRequests[1].authorization, `Bearer ${ADMIN_TOKEN}`);
  assert.equal(streamRequests[1]['last-event-id'], '41');

  await page.click('#tabs a[data-tab="aggregates"]');
  await waitText(page, '#saves-body', 'unavailable');
  await waitText(page, '#agg-body', 'Aggregates unavailable');
  await page.click('#tabs a[data-tab="destinations"]');
  await waitText(page, '#dest-body', 'Destinations unavailable');
  assert.equal(await page.isVisible('#dlv-panel'), false);
  await page.click('#tabs a[data-tab="events"]');
  await waitText(page, '#events-body', 'No events match');
  assert.deepEqual(problems, []);
});

// ------------------------------------------------------------------ forwarding

/**
 * The user's application, as a destination sees it: answers 500 to the aggregates in
 * `failing` and 204 to every other, and records each request it got.
 */
async function startApplication() {
  const failing = new Set();
  const received = [];
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const aggregate = req.headers['inhook-aggregate'];
      const ok = !failing.has(aggregate);
      received.push({
        ok, aggregate,
        webhookId: req.headers['webhook-id'],
        eventId: req.headers['inhook-event-id'],
        sequence: Number(req.headers['inhook-sequence']),
        body: Buffer.concat(chunks).toString(),
      });
      res.writeHead(ok ? 204 : 500, { 'content-type': 'text/plain' });
      res.end(ok ? '' : 'down for this aggregate');
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: server.address().port,
    failing,
    received,
    /** The 2xx requests the application answered for one event. */
    delivered: (eventId) => received.filter((r) => r.ok && r.eventId === eventId),
    close() {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(resolve));
    },
  };
}

test('dashboard: destinations show dead deliveries, and Skip, Replay and bulk replay deliver', async (t) => {
  const app = await startApplication();
  // An in-order json source: a dead delivery blocks its aggregate for the destination.
  const server = await startServer({
    adminToken: ADMIN_TOKEN,
    extra: `
[[sources]]
name = "orders"
kind = "json"
mode = "sync"
signature = "github"
secrets = ["${ORDERS_SECRET}"]
event_id = "/id"
event_type = "/type"
aggregate = "/order"
sequence = "/seq"
ordering = "in-order"

[[destinations]]
name = "app"
url = "http://e2e:pw@127.0.0.1:${app.port}/hooks"
sources = ["orders"]
secret = "${DEST_SECRET}"
timeout_s = 5
max_attempts = 1
retry_base_s = 1
`,
  });
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await server.stop();
    await app.close();
  });
  const page = browser.context.pages()[0] || await browser.context.newPage();
  const dialogs = [];
  const problems = watch(page, { accept: /^(Skip|Replay) /, dialogs });
  const postOrder = async (id, order, seq) => {
    const r = await postGithubSigned(server, 'orders', ORDERS_SECRET, { id, type: 'order.updated', order, seq });
    assert.equal(r.body.status, 'applied', JSON.stringify(r.body));
  };
  const deliveries = async (q) => (await apiGet(server, `/v1/destinations/app/deliveries${q}`)).body.items;
  const deliveryOf = async (eventId) => (await deliveries('?limit=500')).find((d) => d.event_id === eventId);
  const receivedOk = (eventId) => waitFor(`${eventId} delivered to the application`, async () => {
    const got = app.delivered(eventId);
    return { ok: got.length > 0, value: app.received.map((r) => `${r.eventId}:${r.ok}`) };
  });
  const dlvRow = (eventId) => page.locator('#dlv-body tbody tr', { hasText: eventId });

  // One healthy aggregate; four the application refuses, each dead after its one attempt.
  for (const order of ['o-1', 'o-2', 'o-3', 'o-4']) app.failing.add(order);
  await postOrder('ord_ok_1', 'o-ok', 1);
  for (const order of ['o-1', 'o-2', 'o-3', 'o-4']) await postOrder(`ord_${order.slice(2)}_1`, order, 1);
  await receivedOk('ord_ok_1');
  await waitFor('four dead deliveries', async () => {
    const dead = await deliveries('?status=dead');
    return { ok: dead.length === 4, value: dead.map((d) => d.event_id) };
  });
  // The next event of a blocked aggregate waits behind its dead one.
  await postOrder('ord_1_2', 'o-1', 2);
  assert.notEqual((await deliveryOf('ord_1_2')).status, 'delivered');

  await page.goto(server.url + '/');
  await page.fill('#token', ADMIN_TOKEN);
  await page.click('#login-button');
  await page.locator('#tabs').waitFor();

  await t.test('the destination row shows its dead deliveries and blocked aggregates, the URL masked', async () => {
    await page.click('#tabs a[data-tab="destinations"]');
    const row = page.locator('#dest-body tr[data-key="app"]');
    await row.waitFor();
    await page.waitForFunction(() => {
      const fig = (f) => document.querySelector(`#dest-body tr[data-key="app"] [data-figure="${f}"]`);
      return fig('dead') && fig('dead').textContent === '4' && fig('blocked').textContent === '4';
    }, null, { timeout: WAIT });
    const text = await row.innerText();
    assert.match(text, /\*\*\*@127\.0\.0\.1/);
    assert.doesNotMatch(await page.textContent('#dest-body'), /pw@|whsec_/);
    assert.match(text, /closed/);
    assert.match(text, /HTTP 500/);
    // The tab's badge counts what it lists: the dead deliveries; the Dead letters badge
    // counts dead events, and none of those is dead here.
    await page.waitForFunction(() => document.getElementById('dest-dead-count').textContent === '4', null, { timeout: WAIT });
    assert.equal(await page.locator('#dead-count').isHidden(), true);
  });

  await t.test('picking the destination lists its dead deliveries; one opens with its attempts', async () => {
    await page.locator('#dest-body tr[data-key="app"]').click();
    await page.locator('#dlv-panel').waitFor();
    assert.equal(await page.inputValue('#dlv-status'), 'dead');
    await waitText(page, '#dlv-body', ['ord_1_1', 'ord_2_1', 'ord_3_1', 'ord_4_1']);
    assert.equal(await page.locator('#dlv-body tbody tr').count(), 4);
    const text = await dlvRow('ord_2_1').innerText();
    for (const want of ['o-2', 'seq 1', 'dead', 'HTTP 500', 'Replay', 'Skip']) assert.ok(text.includes(want), `${want} in ${text}`);
    await shot(page, 'destinations');

    const d = await deliveryOf('ord_2_1');
    await dlvRow('ord_2_1').click();
    await page.locator('#detail').waitFor();
    await waitText(page, '#detail-title', `delivery ${d.id}`);
    await waitText(page, '#detail-body', ['Attempts', 'HTTP 500', d.webhook_id, 'o-2']);
    assert.equal(await page.locator('#detail-body table.attempts tbody tr').count(), 1);
    await shot(page, 'destination-delivery');
    await page.keyboard.press('Escape');
    await page.locator('#detail').waitFor({ state: 'hidden' });
  });

  await t.test('Skip, once confirmed, unblocks the aggregate: its next event is delivered', async () => {
    app.failing.delete('o-1');
    await dlvRow('ord_1_1').locator('button[data-action="skip"]').click();
    await waitText(page, `#dlv-body tr[data-key="${(await deliveryOf('ord_1_1')).id}"]`, 'skipped');
    assert.match(dialogs.at(-1), /^Skip delivery \d+ \(ord_1_1, o-1 #1\)/);
    assert.equal((await deliveryOf('ord_1_1')).status, 'skipped');
    await receivedOk('ord_1_2');
    assert.equal(app.delivered('ord_1_1').length, 0, 'a skipped delivery is never sent');
    await waitFor('ord_1_2 delivered', async () => {
      const d = await deliveryOf('ord_1_2');
      return { ok: d.status === 'delivered', value: d };
    });
    // The status filter shows it among the skipped ones.
    await page.selectOption('#dlv-status', 'skipped');
    await page.waitForFunction(() => document.querySelectorAll('#dlv-body tbody tr').length === 1, null, { timeout: WAIT });
    await waitText(page, '#dlv-body', 'ord_1_1');
    await page.selectOption('#dlv-status', 'dead');
    await page.waitForFunction(() => document.querySelectorAll('#dlv-body tbody tr').length === 3, null, { timeout: WAIT });
  });

  await t.test('with the application fixed, Replay delivers a dead delivery with the same webhook-id', async () => {
    app.failing.clear();
    const d = await deliveryOf('ord_2_1');
    const first = app.received.find((r) => r.eventId === 'ord_2_1');
    assert.equal(first.ok, false);
    await dlvRow('ord_2_1').locator('button[data-action="replay"]').click();
    await receivedOk('ord_2_1');
    assert.equal(app.delivered('ord_2_1')[0].webhookId, d.webhook_id);
    assert.equal(first.webhookId, d.webhook_id);
    await waitText(page, `#dlv-body tr[data-key="${d.id}"]`, 'delivered');
    assert.equal((await deliveryOf('ord_2_1')).status, 'delivered');
  });

  await t.test('Replay dead replays the rest as one job and shows its progress', async () => {
    await page.click('#dlv-replay-all');
    await waitText(page, '#dlv-info', ['replay job #', 'done', '2/2 requeued']);
    assert.match(dialogs.at(-1), /^Replay every dead delivery to app\?/);
    await receivedOk('ord_3_1');
    await receivedOk('ord_4_1');
    // The dead list empties; the rows acted on here stay, with their new status, until the view is left.
    await page.waitForFunction(() => {
      const text = document.getElementById('dlv-body').textContent;
      return !text.includes('ord_3_1') && !text.includes('ord_4_1') && text.includes('ord_2_1');
    }, null, { timeout: WAIT });
    await page.waitForFunction(() => {
      const fig = (f) => document.querySelector(`#dest-body tr[data-key="app"] [data-figure="${f}"]`);
      return fig('dead') && fig('dead').textContent === '0' && fig('blocked').textContent === '0';
    }, null, { timeout: WAIT });
    assert.deepEqual((await deliveries('?status=dead')), []);
  });

  await t.test('on a 390 px phone the view does not scroll sideways', async () => {
    await page.selectOption('#dlv-status', '');
    await waitText(page, '#dlv-body', ['ord_ok_1', 'ord_1_2', 'skipped', 'delivered']);
    await page.setViewportSize({ width: 390, height: 844 });
    await page.waitForTimeout(300);
    assert.ok(await noHorizontalScroll(page), 'destinations scroll sideways at 390 px');
    await shot(page, 'phone-destinations', { fullPage: true });
    await dlvRow('ord_3_1').click();
    await waitText(page, '#detail-body', ['Attempts', 'HTTP 500', 'HTTP 204']);
    assert.ok(await noHorizontalScroll(page), 'the delivery drawer scrolls sideways at 390 px');
    await page.keyboard.press('Escape');
    await page.setViewportSize({ width: 1280, height: 800 });
  });

  await t.test('publisher strings in deliveries are shown as text, never run as markup', async () => {
    // No space: the inhook-event-id header percent-encodes one.
    const probe = '<img/src=x/onerror=window.__xss=1>';
    await postOrder(probe, '<em>o', 1);
    await receivedOk(probe);
    await page.selectOption('#dlv-status', '');
    await waitText(page, '#dlv-body', [probe, '<em>o', 'ord_ok_1', 'ord_1_2', 'skipped', 'delivered']);
    assert.equal(await page.locator('#dlv-body img, #dlv-body em').count(), 0);
    await dlvRow(probe).click();
    await waitText(page, '#detail-body', [probe, 'HTTP 204']);
    assert.equal(await page.locator('#detail img').count(), 0);
    await page.keyboard.press('Escape');
    assert.equal(await page.evaluate(() => window.__xss), undefined);
  });

  assert.deepEqual(problems, [], 'no page errors, console errors or unexpected dialogs');
});

test('dashboard: cards fit, times carry dates, timestamp sequences read as dates, the stream opens with history', async (t) => {
  const STRIPE_SECRET = 'whsec_e2e_stripe_secret_0123456789';
  const server = await startServer({
    adminToken: ADMIN_TOKEN,
    extra: `
[[sources]]
name = "payments-from-stripe-production-account"
preset = "stripe"
secrets = ["${STRIPE_SECRET}"]

[[sources]]
name = "workspace-events-from-slack"
preset = "slack-events"
secrets = ["slack-e2e-signing-secret-0123456789"]
`,
  });
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await server.stop();
  });
  // Changes made before anyone looks: the stream must open with them.
  for (const [id, seq] of [['evt_hist_1', 1], ['evt_hist_2', 2]]) {
    const r = await postPresence(server, { event_id: id, user_id: 'usr_history', presence: seq === 1 ? 'ONLINE' : 'BUSY', sequence_number: seq });
    assert.equal(r.code, 200, JSON.stringify(r.body));
  }
  // A Stripe event ordered by `created`, unix seconds.
  const created = 1796649298;
  const body = JSON.stringify({ id: 'evt_e2e_stripe_1', object: 'event', type: 'customer.updated', created,
    data: { object: { id: 'cus_e2e', object: 'customer' } } });
  const ts = Math.floor(Date.now() / 1000);
  const signed = await fetch(`${server.url}/webhooks/payments-from-stripe-production-account`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'Stripe-Signature': `t=${ts},v1=${hmacHex(STRIPE_SECRET, `${ts}.${body}`)}` },
    body,
  });
  assert.ok(signed.status >= 200 && signed.status < 300, `stripe delivery answered ${signed.status}`);

  const page = browser.context.pages()[0] || await browser.context.newPage();
  const problems = watch(page);
  await page.goto(server.url + '/');
  await page.fill('#token', ADMIN_TOKEN);
  await page.click('#login-button');
  const card = '.card[data-source="payments-from-stripe-production-account"]';
  await waitText(page, card, ['preset stripe']);
  await waitText(page, '.card[data-source="workspace-events-from-slack"]', ['preset slack-events', 'handshake slack']);

  await t.test('at 1280 px every card holds its badges', async () => {
    const overflowing = await page.evaluate(() => [...document.querySelectorAll('.card')]
      .filter((c) => c.scrollWidth > c.clientWidth || [...c.querySelectorAll('.badge')].some((b) => b.getBoundingClientRect().right > c.getBoundingClientRect().right))
      .map((c) => c.dataset.source));
    assert.deepEqual(overflowing, []);
    assert.ok(await noHorizontalScroll(page), 'the overview scrolls sideways at 1280 px');
  });

  await t.test('at 390 px the overview does not scroll sideways', async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    await page.waitForTimeout(300);
    assert.ok(await noHorizontalScroll(page), 'the overview scrolls sideways at 390 px');
    await page.setViewportSize({ width: 1280, height: 800 });
  });

  await t.test('times carry their date and a timestamp sequence reads as a date', async () => {
    await page.click('#tabs a[data-tab="events"]');
    await waitText(page, '#events-body', ['evt_e2e_stripe_1', 'evt_hist_2']);
    const row = await page.locator('#events-body tbody tr', { hasText: 'evt_e2e_stripe_1' }).innerText();
    assert.match(row, /\d{4}-\d\d-\d\d \d\d:\d\d:\d\d/, 'the receipt time has its date');
    assert.match(row, /2026-12-07 13:14:58/, 'created shown as a date (UTC)');
    assert.doesNotMatch(row, /1,796,649,298/);
    const seqTitle = await page.locator('#events-body tbody tr', { hasText: 'evt_e2e_stripe_1' }).locator('[data-seq]').first().getAttribute('title');
    assert.equal(seqTitle, `sequence ${created}`);
    const presenceRow = await page.locator('#events-body tbody tr', { hasText: 'evt_hist_2' }).innerText();
    assert.doesNotMatch(presenceRow, /1970-/, 'a small sequence stays a number');
  });

  await t.test('the live stream opens with the latest changes', async () => {
    await page.click('#tabs a[data-tab="stream"]');
    await waitText(page, '#stream-body', ['usr_history']);
  });
  assert.deepEqual(problems, []);
});

test('dashboard: a preset source shows its preset and the handshakes it answered', async (t) => {
  const server = await startServer({
    adminToken: ADMIN_TOKEN,
    extra: `
[[sources]]
name = "files"
preset = "dropbox"
secrets = ["dropbox-e2e-secret"]
`,
  });
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await server.stop();
  });
  // Dropbox checks the endpoint with a GET before it sends anything.
  for (const challenge of ['c-1', 'c-2']) {
    const reply = await fetch(`${server.url}/webhooks/files?challenge=${challenge}`);
    assert.equal(reply.status, 200);
    assert.equal(await reply.text(), challenge);
  }
  const page = browser.context.pages()[0] || await browser.context.newPage();
  const problems = watch(page);
  await page.goto(server.url + '/');
  await page.fill('#token', ADMIN_TOKEN);
  await page.click('#login-button');
  await waitText(page, '.card[data-source="files"]', ['preset dropbox', 'handshake dropbox · 2']);
  // A source without a preset or a handshake shows neither.
  const seed = await page.textContent('.card[data-source="save-game"]');
  assert.ok(!seed.includes('preset') && !seed.includes('handshake'), seed);
  assert.deepEqual(problems, []);
});

test('dashboard: the alerts tab lists a rule firing and resolving, and counts what fires', async (t) => {
  // A Slack stand-in: what the rule's notices reach.
  const app = await startApplication();
  const server = await startServer({
    adminToken: ADMIN_TOKEN,
    top: 'alert_tick_ms = 200',
    extra: `
[[alerts]]
name = "saves-silent"
on = "source_silent"
source = "save-game"
after_s = 1
slack_webhook_url = "http://127.0.0.1:${app.port}/slack"
`,
  });
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await server.stop();
    await app.close();
  });
  const page = browser.context.pages()[0] || await browser.context.newPage();
  const problems = watch(page);
  await page.goto(server.url + '/');
  await page.locator('#login').waitFor();
  await page.fill('#token', ADMIN_TOKEN);
  await page.click('#login-button');
  await page.locator('#tabs').waitFor();

  // Silent for over a second: the rule fires, the badge counts it on every tab.
  await page.waitForFunction(() => document.getElementById('alert-count').textContent === '1'
    && !document.getElementById('alert-count').hidden, null, { timeout: WAIT });
  await page.click('#tabs a[data-tab="alerts"]');
  await waitText(page, '#alerts-body', ['saves-silent', 'source_silent', 'firing', 'save-game', 'no delivery from save-game']);
  const slack = await waitFor('the firing message', async () => ({ ok: app.received.length >= 1, value: app.received }));
  assert.match(JSON.parse(slack[0].body).text, /^\[inhook\] saves-silent firing \(save-game\)/);
  await shot(page, 'alerts');

  // A delivery ends the silence: a resolved row on top, and no alert left firing.
  const r = await postSave(server, saveEvent('evt_alerts_0001', 'inventory.updated', 1, { added_items: [{ item_id: 'gem', qty: 1 }] }));
  assert.equal(r.code, 202, JSON.stringify(r.body));
  await waitText(page, '#alerts-body tbody tr:first-child', 'resolved');
  await page.waitForFunction(() => document.getElementById('alert-count').hidden, null, { timeout: WAIT });
  const rows = await page.locator('#alerts-body tbody tr').allInnerTexts();
  assert.equal(rows.length, 2);
  assert.match(rows[1], /firing/);
  await waitFor('the resolved message', async () => ({ ok: app.received.length >= 2, value: app.received }));
  assert.match(JSON.parse(app.received[1].body).text, /saves-silent resolved/);
  assert.deepEqual(problems, []);
});

test('dashboard: each source charts its last hour, with its last delivery and rejections by reason', async (t) => {
  const server = await startServer({ adminToken: ADMIN_TOKEN });
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await server.stop();
  });
  for (let seq = 1; seq <= 5; seq += 1) {
    const reply = await postPresence(server, { event_id: `chart_${seq}`, user_id: 'u_chart', presence: 'ONLINE', sequence_number: seq });
    assert.equal(reply.code, 200, JSON.stringify(reply.body));
  }
  // The most common incident: a publisher signing with a wrong secret.
  const body = JSON.stringify({ event_id: 'chart_bad', user_id: 'u_chart', presence: 'AWAY', sequence_number: 6 });
  const refused = await fetch(`${server.url}/webhooks/presence`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-Signature': hmacHex('not-the-secret', body) },
    body,
  });
  assert.equal(refused.status, 401);
  const page = browser.context.pages()[0] || await browser.context.newPage();
  const problems = watch(page);
  await page.goto(server.url + '/');
  await page.fill('#token', ADMIN_TOKEN);
  await page.click('#login-button');
  const card = '.card[data-source="presence"]';
  await waitText(page, card, ['last delivery', 'invalid signature · 1']);
  await waitText(page, '.card[data-source="save-game"]', ['no delivery yet', 'no rejections in 24 h']);
  await page.waitForSelector(`${card} [data-chart="lag"] [data-series="p50"] :is(polyline, circle)`, { timeout: WAIT });
  // Each line carries the sum of what it draws: the figures the server counted.
  const totals = await page.evaluate((sel) => Object.fromEntries(
    [...document.querySelectorAll(`${sel} [data-series]`)]
      .map((g) => [`${g.closest('[data-chart]').dataset.chart}.${g.dataset.series}`, Number(g.dataset.total)]),
  ), card);
  assert.equal(totals['rate.received'], 6, JSON.stringify(totals));
  assert.equal(totals['rate.applied'], 5, JSON.stringify(totals));
  assert.equal(totals['rate.rejected'], 1, JSON.stringify(totals));
  assert.ok(totals['lag.p50'] >= 1 && totals['lag.p99'] >= totals['lag.p50'], JSON.stringify(totals));
  // Drawn, not only counted: the received line rises off the axis at the current minute.
  const highest = await page.evaluate((sel) => {
    const line = document.querySelector(`${sel} [data-chart="rate"] [data-series="received"] polyline`);
    return Math.min(...line.getAttribute('points').split(' ').map((p) => Number(p.split(',')[1])));
  }, card);
  assert.ok(highest < 10, `the received line peaks at y=${highest}`);
  const box = await page.locator(`${card} [data-chart="rate"] svg`).boundingBox();
  assert.ok(box && box.width > 200 && box.height >= 40, JSON.stringify(box));
  assert.ok(await noHorizontalScroll(page));
  await shot(page, 'overview-charts', { fullPage: true });
  assert.deepEqual(problems, []);
});
