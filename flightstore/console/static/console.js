"use strict";
// The console's pages: each fetches its /api/... answer and draws it with DOM calls (names and
// SQL text only ever become text, never markup). The visible page refreshes every 5 s.

const REFRESH_MS = 5000;
let me = {user: null, super: true, auth: false};
let timer = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "onclick") node.addEventListener("click", value);
    else if (value !== null && value !== undefined) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function fmt(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(2);
  if (Array.isArray(value)) return value.join(", ");
  return String(value);
}

function when(ms) { return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "—"; }

function grid(headers, rows, rowAttrs) {
  return el("table", {},
    el("thead", {}, el("tr", {}, headers.map(([, label]) => el("th", {}, label)))),
    el("tbody", {}, rows.map((row, i) => el("tr", rowAttrs ? rowAttrs(row, i) : {},
      headers.map(([field, , render]) => {
        const value = render ? render(row) : row[field];
        const numeric = typeof row[field] === "number";
        return el("td", {"data-field": field, class: numeric ? "num" : null},
                  value instanceof Node ? value : fmt(value));
      })))));
}

async function api(path, options) {
  const answer = await fetch(path, Object.assign({headers: {"X-Flightstore-Console": "1",
                                                            "Content-Type": "application/json"}}, options));
  if (answer.status === 401) { window.location.assign("/login"); throw new Error("log in"); }
  const body = await answer.json();
  if (!answer.ok) throw new Error(body.error || answer.statusText);
  return body;
}

// ---- pages -------------------------------------------------------------------------------------
async function tablesPage() {
  const data = await api("/api/tables");
  const out = [el("h2", {}, "Databases and tables")];
  for (const db of data.databases) {
    out.push(el("h3", {"data-database": db.name}, db.name));
    if (!db.tables.length) { out.push(el("p", {class: "muted"}, "no table")); continue; }
    out.push(grid([
      ["name", "Table", (t) => el("a", {href: `#/table/${t.database}.${t.name}`}, t.name)],
      ["kind", "Kind"], ["buckets", "Buckets"], ["partitions", "Partitions"],
      ["schema_version", "Schema version"], ["primary_key", "Primary key"],
      ["datalake", "Lake", (t) => t.datalake ? "yes" : "no"],
      ["options", "Options", (t) => Object.entries(t.options).map(([k, v]) => `${k}=${v}`).join(", ")],
    ], db.tables, (t) => ({"data-table": `${t.database}.${t.name}`})));
  }
  return out;
}

async function tablePage(name) {
  const t = await api("/api/table?name=" + encodeURIComponent(name));
  const facts = [["Kind", t.kind], ["Rows", t.row_count, "row-count"], ["Buckets", t.buckets],
                 ["Partitions", t.partitions], ["Schema version", t.schema_version],
                 ["Primary key", t.primary_key], ["Bucket key", t.bucket_key],
                 ["Partition keys", t.partition_keys], ["Lake", t.datalake ? "enabled" : "off"],
                 ["Options", Object.entries(t.options).map(([k, v]) => `${k}=${v}`).join(", ")]];
  if (t.unavailable_buckets.length)  // their leader is down: no row count, no log offsets meanwhile
    facts.push(["Unavailable buckets", t.unavailable_buckets, "unavailable-buckets"]);
  const out = [el("h2", {id: "table-name"}, `${t.database}.${t.name}`),
               el("table", {class: "kv"}, facts.map(([label, value, id]) =>
                 el("tr", {}, el("td", {}, label), el("td", {id: id || null}, fmt(value)))))];
  out.push(el("h3", {}, "Buckets"));
  out.push(grid([["bucket", "Bucket"], ["partition", "Partition"], ["leader", "Leader"],
                 ["replicas", "Replicas"], ["isr", "ISR"], ["log_start", "Log start"], ["log_end", "Log end"],
                 ["kv_snapshot_offset", "KV snapshot offset"], ["lake_tiered_offset", "Lake tiered offset"],
                 ["lake_lag_records", "Lake lag (records)"], ["bytes", "Size on disk (bytes)"]],
                t.bucket_list, (b) => ({"data-bucket": b.bucket})));
  if (t.partition_list.length) {
    out.push(el("h3", {}, "Partitions"));
    out.push(grid([["name", "Partition"], ["id", "Id"], ["row_count", "Rows"]], t.partition_list,
                  (p) => ({"data-partition": p.name})));
  }
  out.push(el("h3", {}, "Schema versions"));
  for (const v of t.schema_versions.slice().reverse()) {
    out.push(el("p", {"data-schema-version": v.version}, el("strong", {}, `version ${v.version}: `),
                v.columns.map((c) => `${c.name} ${c.type}${c.nullable ? "" : " NOT NULL"}`).join(", ")));
  }
  return out;
}

async function lakePage() {
  const data = await api("/api/lake");
  const out = [el("h2", {}, "Lake")];
  if (!data.enabled) return out.concat(el("p", {class: "muted"}, "This server has no lake."));
  if (!data.tables.length) out.push(el("p", {class: "muted"}, "No datalake-enabled table."));
  for (const t of data.tables) {
    out.push(el("h3", {"data-lake-table": t.table}, t.table));
    if (t.error) { out.push(el("p", {class: "error"}, t.error)); continue; }
    out.push(el("table", {class: "kv", "data-lake-summary": t.table}, [
      ["Snapshots", t.snapshots, "snapshots"], ["Data files", t.files, "files"],
      ["Tiering lag (records)", t.lag_records, "lag_records"], ["Tiering lag (s)", t.lag_seconds, "lag_seconds"],
      ["Last commit", when(t.last_commit), "last_commit"], ["Tierer", t.tierer, "tierer"],
      ["Last error", t.last_error, "last_error"], ["Last upkeep", when(t.last_upkeep), "last_upkeep"],
      ["Upkeep: snapshots expired / files removed",
       `${fmt(t.upkeep_expired_snapshots)} / ${fmt(t.upkeep_removed_files)}`, "upkeep"],
    ].map(([label, value, field]) => el("tr", {}, el("td", {}, label), el("td", {"data-field": field}, fmt(value))))));
    if (t.recent_snapshots.length) {
      out.push(grid([["snapshot_id", "Snapshot"], ["committed_at", "Committed", (s) => when(s.committed_at)],
                     ["added_rows", "Added rows"], ["total_rows", "Total rows"]], t.recent_snapshots));
    }
  }
  return out;
}

async function clusterPage() {
  const data = await api("/api/cluster");
  const out = [el("h2", {}, "Cluster")];
  if (data.mode === "single") return out.concat(el("p", {}, `One server (no cluster) at ${data.uri}.`));
  out.push(el("p", {}, `This server: ${data.server_id}; coordinator: ${fmt(data.coordinator)}; ` +
                       `catalog version ${data.catalog_version}.`));
  out.push(grid([["id", "Server"], ["uri", "URI"], ["pid", "PID"], ["catalog_version", "Catalog version"]],
                data.servers));
  out.push(el("h3", {}, "Unavailable buckets"));
  out.push(data.unavailable.length ? grid([["table", "Table"], ["bucket", "Bucket"], ["leader", "Leader"],
                                           ["isr", "ISR"], ["reason", "Why"]], data.unavailable)
                                   : el("p", {class: "muted"}, "none"));
  return out;
}

function plot(title, points, series, unit) {
  const width = 560, height = 140, pad = 30;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", width); svg.setAttribute("height", height);
  const values = points.flatMap((p) => series.map(([key]) => p[key])).filter((v) => v !== null);
  const top = Math.max(1e-9, ...values);
  const t0 = points.length ? points[0].t : 0, t1 = points.length ? points[points.length - 1].t : 1;
  const x = (t) => pad + (width - pad - 5) * (t1 > t0 ? (t - t0) / (t1 - t0) : 1);
  const y = (v) => height - 15 - (height - 25) * (v / top);
  for (const [key, color] of series) {
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("fill", "none"); line.setAttribute("stroke", color); line.setAttribute("stroke-width", "1.5");
    line.setAttribute("points", points.filter((p) => p[key] !== null).map((p) => `${x(p.t)},${y(p[key])}`).join(" "));
    svg.append(line);
  }
  const text = (x, content, color) => {
    const node = document.createElementNS(ns, "text");
    node.setAttribute("x", x); node.setAttribute("y", 12); node.setAttribute("font-size", "11");
    node.setAttribute("fill", color); node.textContent = content;
    svg.append(node);
  };
  text(2, `max ${fmt(top)} ${unit}`, "#1d2330");
  series.forEach(([, color, name], i) => text(width - 150 + 60 * i, name, color));
  return el("div", {class: "plot", "data-plot": title}, el("strong", {}, title), svg);
}

async function ratesPage() {
  const data = await api("/api/rates");
  const points = data.points;
  const last = points.length ? points[points.length - 1] : {};
  return [el("h2", {}, "Rates (last hour)"),
          el("p", {class: "muted"}, `One point every ${data.interval_s} s from this server's metrics; ` +
                                    `${points.length} so far. Queries running now: ${fmt(last.active_queries)}.`),
          el("div", {class: "plots"},
             plot("Rows written /s", points, [["rows_in", "#2f6fdf", "written"]], "rows/s"),
             plot("Rows read /s", points, [["rows_out", "#1f9d55", "read"]], "rows/s"),
             plot("Query calls /s", points, [["queries", "#6b46c1", "calls"], ["failed", "#b3261e", "failed"]], "/s"),
             plot("Lookup latency (ms)", points, [["lookup_p50", "#2f6fdf", "p50"], ["lookup_p99", "#b3261e", "p99"]], "ms"),
             plot("Query call latency (ms)", points, [["query_p50", "#2f6fdf", "p50"], ["query_p99", "#b3261e", "p99"]], "ms"))];
}

async function queriesPage() {
  const data = await api("/api/queries");
  const out = [el("h2", {}, "Running queries")];
  if (!data.queries.length) return out.concat(el("p", {class: "muted", id: "no-queries"}, "No query is running."));
  out.push(grid([["number", "#"], ["user", "User"], ["started_ms", "Started", (q) => when(q.started_ms)],
                 ["sql", "SQL", (q) => el("code", {}, q.sql || "")],
                 ["cancel", "", (q) => (data.may_cancel_any || q.user === me.user)
                   ? el("button", {type: "button", "data-cancel": q.number, onclick: async () => {
                       await api("/api/queries/cancel", {method: "POST", body: JSON.stringify({number: q.number})});
                       route();
                     }}, "Cancel") : ""]],
                data.queries, (q) => ({"data-query": q.number})));
  return out;
}

// ---- routing -----------------------------------------------------------------------------------
async function route() {
  const hash = window.location.hash || "#/tables";
  const [, page, arg] = hash.match(/^#\/([a-z]+)\/?(.*)$/) || [null, "tables", ""];
  for (const link of document.querySelectorAll("header nav a")) {
    link.classList.toggle("active", link.getAttribute("href") === `#/${page === "table" ? "tables" : page}`);
  }
  const pages = {tables: tablesPage, table: () => tablePage(decodeURIComponent(arg)), lake: lakePage,
                 cluster: clusterPage, rates: ratesPage, queries: queriesPage};
  const main = document.getElementById("page");
  try {
    const content = await (pages[page] || tablesPage)();
    main.replaceChildren(...content);
    main.setAttribute("data-page", page);
    main.setAttribute("data-loaded", Date.now());
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (error) {
    main.replaceChildren(el("p", {class: "error", id: "page-error"}, error.message));
    main.setAttribute("data-page", page);
  }
}

async function start() {
  me = await api("/api/whoami");
  document.getElementById("whoami").textContent = me.auth ? `${me.user}${me.super ? " (super user)" : ""}` : "";
  const logout = document.getElementById("logout");
  logout.hidden = !me.auth;
  logout.addEventListener("click", async () => {
    await fetch("/api/logout", {method: "POST", headers: {"X-Flightstore-Console": "1"}});
    window.location.assign("/login");
  });
  window.addEventListener("hashchange", route);
  await route();
  timer = setInterval(() => { if (!document.hidden) route(); }, REFRESH_MS);
}

start();
