// The admin page: who is being limited now, the rules in force and the
// store's health, refreshed every 2 s. Every value a client sent is shown
// with textContent, never parsed as HTML, and through visible(): a
// character that does not show as itself is shown escaped.
"use strict";

const REFRESH_MS = 2000;

// Controls (Cc), format characters (Cf: bidi overrides and isolates,
// zero-width spaces and joiners, the BOM, the soft hyphen), line and
// paragraph separators, and blanks that render as nothing: each would let
// one client, rule or path look like another.
const HIDDEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\u034F\u115F\u1160\u3164\uFFA0\u2800\uFE00-\uFE0F\u{E0100}-\u{E01EF}]/gu;

// `text` with every hidden character written as \u{hex}, as tollgate top
// and the logs write it; `lines` keeps line breaks (for multi-line text).
function visible(text, lines) {
  const escape = (c) => "\\u{" + c.codePointAt(0).toString(16) + "}";
  const one = (t) => t.replace(HIDDEN, escape);
  const all = String(text);
  return lines ? all.split("\n").map(one).join("\n") : one(all);
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = visible(text);
  if (cls) e.className = cls;
  return e;
}

function descriptorsText(descriptors) {
  return descriptors
    .map((d) => d.map((e) => e.key + "=" + e.value).join(", "))
    .join(" | ");
}

function renderLimited(view) {
  const box = document.getElementById("limited");
  box.replaceChildren();
  const whose = view.scope === "merged"
    ? "every instance on this Redis (" + view.instances + " publishing)"
    : "this instance";
  document.getElementById("window").textContent =
    visible("The last " + view.window_seconds + " s, " + whose +
    "; up to " + view.slots + " clients per rule.");
  if (view.rules.length === 0) {
    box.append(el("p", "Nobody is being limited.", "note"));
    return;
  }
  for (const rule of view.rules) {
    const title = el("h3");
    title.append(el("code", rule.rule));
    title.append(visible(" (" + rule.domain + ") " + rule.refused + " refused"));
    if (rule.source) title.append(el("span", " at " + rule.source, "note"));
    box.append(title);
    const table = el("table");
    const head = el("tr");
    for (const h of ["client (every descriptor of its last refused request)", "refused", "admitted", "share", "first refused", "last refused"]) {
      head.append(el("th", h));
    }
    table.append(head);
    for (const c of rule.clients) {
      const row = el("tr");
      const who = el("td");
      who.append(el("code", descriptorsText(c.descriptors)));
      row.append(who);
      row.append(el("td", c.refused + (c.error ? " (±" + c.error + ")" : ""), "n"));
      row.append(el("td", c.admitted, "n"));
      row.append(el("td", Math.round(c.share * 100) + " %", "n"));
      row.append(el("td", c.first_refused));
      row.append(el("td", c.last_refused));
      table.append(row);
    }
    box.append(table);
  }
}

async function refresh() {
  const search = document.getElementById("search").value.trim();
  const params = new URLSearchParams();
  if (search) params.set("search", search);
  if (document.getElementById("merged").checked) params.set("scope", "merged");
  const query = params.toString() ? "?" + params.toString() : "";
  try {
    const limited = await fetch("/limited" + query, { headers: { Accept: "application/json" } });
    if (limited.ok) {
      renderLimited(await limited.json());
    } else {
      // The memory store has no other instances to merge: its answer says so.
      document.getElementById("limited").replaceChildren(
        el("p", "GET /limited" + query + ": " + limited.status + " " + (await limited.text()), "note"));
    }
  } catch (e) {
    document.getElementById("limited").replaceChildren(el("p", "Could not read /limited: " + e, "note"));
  }
  try {
    const health = await fetch("/healthcheck");
    const text = (await health.text()).trim();
    const pill = document.getElementById("health");
    pill.textContent = visible(health.ok ? "store: " + text : "unhealthy: " + text);
    pill.className = "pill " + (health.ok ? "ok" : "bad");
  } catch (e) {
    document.getElementById("health").textContent = "unreachable";
  }
  try {
    const rules = await fetch("/rlconfig");
    document.getElementById("rules").textContent = visible(await rules.text(), true);
  } catch (e) {
    document.getElementById("rules").textContent = visible("Could not read /rlconfig: " + e);
  }
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}

// One client's counters: POST /counters with the descriptor typed as
// "key=value, key=value" (or given in the address: #inspect=DOMAIN:key=value,...).
async function inspect(domain, entriesText) {
  const entries = entriesText
    .split(",")
    .map((pair) => pair.trim())
    .filter((pair) => pair.length > 0)
    .map((pair) => {
      const at = pair.indexOf("=");
      return at < 0 ? { key: pair, value: "" } : { key: pair.slice(0, at), value: pair.slice(at + 1) };
    });
  const box = document.getElementById("counters");
  try {
    const answer = await fetch("/counters", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ domain: domain, descriptors: [{ entries: entries }] }),
    });
    if (!answer.ok) {
      box.replaceChildren(el("p", "POST /counters: " + answer.status + " " + (await answer.text()), "note"));
      return;
    }
    const limits = (await answer.json()).limits;
    if (limits.length === 0) {
      box.replaceChildren(el("p", "No limit applies to this descriptor.", "note"));
      return;
    }
    const table = el("table");
    const head = el("tr");
    for (const h of ["rule", "where", "algorithm", "limit", "left", "when"]) head.append(el("th", h));
    table.append(head);
    const seconds = (ms) => (ms / 1000).toFixed(1) + " s";
    for (const l of limits) {
      const row = el("tr");
      row.append(el("td", l.rule));
      row.append(el("td", l.source || ""));
      row.append(el("td", l.algorithm));
      // Each algorithm in its own terms: a bucket's capacity and tokens,
      // a window's count and reset.
      if (l.capacity !== undefined) {
        row.append(el("td", l.limit + " per " + l.unit + ", burst " + l.capacity, "n"));
        row.append(el("td", l.remaining + " of " + l.capacity + " tokens", "n"));
        row.append(el("td", l.remaining >= l.capacity ? "full" : "next token in " + seconds(l.next_token_in_ms), "n"));
      } else {
        row.append(el("td", l.limit + " per " + l.unit, "n"));
        row.append(el("td", l.remaining + " of " + l.limit + " (" + l.used + " used)", "n"));
        row.append(el("td", "resets in " + seconds(l.resets_in_ms), "n"));
      }
      table.append(row);
    }
    box.replaceChildren(table);
  } catch (e) {
    box.replaceChildren(el("p", "Could not read /counters: " + e, "note"));
  }
}

document.getElementById("inspect").addEventListener("submit", (event) => {
  event.preventDefault();
  inspect(document.getElementById("inspect-domain").value.trim(), document.getElementById("inspect-entries").value);
});
// The address may be anyone's link: one that does not decode is said so,
// and the rest of the page runs.
if (location.hash.startsWith("#inspect=")) {
  let asked = null;
  try {
    asked = decodeURIComponent(location.hash.slice("#inspect=".length));
  } catch (e) {
    document.getElementById("counters").replaceChildren(
      el("p", "The address's #inspect= is not valid percent-encoding (" + e.message + "); give #inspect=DOMAIN:key=value,...", "note"));
  }
  if (asked !== null && asked.indexOf(":") > 0) {
    const domain = asked.slice(0, asked.indexOf(":"));
    const entries = asked.slice(asked.indexOf(":") + 1);
    document.getElementById("inspect-domain").value = domain;
    document.getElementById("inspect-entries").value = entries;
    inspect(domain, entries);
  }
}
document.getElementById("search").addEventListener("input", refresh);
// Every instance's view merged: ticked, or asked in the address (#merged).
document.getElementById("merged").checked = location.hash === "#merged";
document.getElementById("merged").addEventListener("change", refresh);
refresh();
setInterval(refresh, REFRESH_MS);
