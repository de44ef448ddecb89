// The cellog console: reads /console/overview every two seconds, tails a stream over server-sent events (read with
// fetch, so the token goes in a header, not the address), and publishes through the JSON API.
"use strict";

const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("cellog-token") || "";
const fragment = new URLSearchParams(location.hash.slice(1));
if (fragment.get("token")) {
  token = fragment.get("token");
  sessionStorage.setItem("cellog-token", token);
  history.replaceState(null, "", location.pathname + location.search);
}

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (token) h["Authorization"] = "Bearer " + token;
  return h;
}

function text(value) {
  return value === undefined || value === null ? "" : String(value);
}

function cell(row, value, className) {
  const td = document.createElement("td");
  td.textContent = text(value);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function fill(tableId, rows, columns, render) {
  const body = $(tableId).querySelector("tbody");
  body.replaceChildren();
  if (rows.length === 0) {
    const tr = document.createElement("tr");
    const td = cell(tr, "none", "empty");
    td.colSpan = columns;
    body.appendChild(tr);
    return;
  }
  for (const row of rows) {
    const tr = document.createElement("tr");
    render(tr, row);
    body.appendChild(tr);
  }
}

function bytes(n) {
  n = Number(n);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function age(ms) {
  ms = Number(ms);
  if (!ms) return "";
  if (ms < 1000) return ms + " ms";
  if (ms < 120000) return (ms / 1000).toFixed(1) + " s";
  return Math.round(ms / 60000) + " min";
}

function problem(message) {
  const p = $("problem");
  p.hidden = !message;
  p.textContent = message || "";
}

function explain(body, status) {
  const error = body && body.error;
  if (!error) return "HTTP " + status;
  let message = error.code + " " + error.reason + ": " + error.message;
  if (error.leader_addr) message += " (leader: " + error.leader_addr + ")";
  return message;
}

async function refresh() {
  let answer;
  try {
    answer = await fetch("/console/overview", { headers: headers() });
  } catch (e) {
    problem("the node does not answer: " + e);
    return;
  }
  const body = await answer.json().catch(() => null);
  if (answer.status === 401) {
    $("login").hidden = false;
    problem("this node asks for a token: " + explain(body, answer.status));
    return;
  }
  if (!answer.ok) {
    problem(explain(body, answer.status));
    return;
  }
  problem("");
  render(body);
}

function render(overview) {
  const c = overview.cluster;
  const leader = c.leader_id ? "node " + c.leader_id + (c.leader_addr ? " at " + c.leader_addr : "") : "none";
  $("cell").innerHTML = "";
  const parts = [["node", c.node_id + " (" + c.state + ")"], ["leader", leader], ["term", c.term],
    ["log", text(c.last_log_index)], ["applied", text(c.applied_index)]];
  for (const [name, value] of parts) {
    const span = document.createElement("span");
    span.textContent = name + " ";
    const b = document.createElement("b");
    b.textContent = text(value);
    span.appendChild(b);
    span.append("  ");
    $("cell").appendChild(span);
  }
  fill("nodes", c.nodes, 4, (tr, node) => {
    const role = c.leader_id && String(node.id) === String(c.leader_id) ? "leader" : node.voter ? "voter" : "learner";
    cell(tr, node.id);
    cell(tr, role, role === "leader" ? "leader" : "");
    cell(tr, node.client_addr);
    cell(tr, node.matched_index, "n");
  });
  fill("streams", overview.streams, 7, (tr, entry) => {
    const s = entry.stream;
    cell(tr, s.name).dataset.stream = s.name;
    cell(tr, (s.config && s.config.subjects || []).join(" "));
    cell(tr, s.partitions.length);
    cell(tr, s.messages, "n").dataset.messages = s.name;
    cell(tr, bytes(s.bytes), "n");
    cell(tr, s.subjects, "n");
    cell(tr, (s.peers || []).map((p) => p.name).join(" "));
  });
  const consumers = [];
  for (const entry of overview.streams) for (const consumer of entry.consumers) consumers.push(consumer);
  fill("consumers", consumers, 8, (tr, k) => {
    cell(tr, k.stream);
    cell(tr, k.name);
    cell(tr, k.lag_total, Number(k.lag_total) > 0 ? "n lagging" : "n");
    cell(tr, k.pending, "n");
    cell(tr, k.ready, "n");
    cell(tr, age(k.oldest_unacked_age_ms), "n");
    cell(tr, k.acked, "n");
    cell(tr, k.dead_lettered, "n");
  });
  const groups = [];
  for (const entry of overview.streams) for (const group of entry.groups || []) groups.push(group);
  fill("groups", groups, 8, (tr, g) => {
    const members = g.members || [];
    cell(tr, g.stream);
    cell(tr, g.name);
    cell(tr, String(g.strategy).replace(/^STRATEGY_/, "").toLowerCase().replace(/_/g, " "));
    cell(tr, g.generation, "n");
    cell(tr, g.rebalancing ? "rebalancing" : "settled", g.rebalancing ? "lagging" : "");
    cell(tr, members.length + (members.length ? ": " + members.map((m) => m.name).join(" ") : ""));
    cell(tr, g.rebalances, "n");
    const lag = g.consumer ? g.consumer.lag_total : 0;
    cell(tr, lag, Number(lag) > 0 ? "n lagging" : "n");
  });
  if (!$("tail-stream").value && overview.streams.length > 0) $("tail-stream").value = overview.streams[0].stream.name;
}

let tailing = null;

function decode(payload) {
  try {
    const raw = atob(payload || "");
    const bytes = Uint8Array.from(raw, (ch) => ch.charCodeAt(0));
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch (e) {
    return "(" + (payload || "").length + " base64 characters of binary)";
  }
}

function show(event, data) {
  const list = $("tail");
  const li = document.createElement("li");
  if (event === "message") {
    const at = document.createElement("span");
    at.className = "at";
    at.textContent = data.partition + "/" + data.seq;
    const subject = document.createElement("span");
    subject.className = "subject";
    subject.textContent = data.subject;
    const payload = document.createElement("span");
    payload.className = "payload";
    payload.textContent = data.recalled_at_ms ? "(recalled)" : decode(data.payload);
    li.append(at, subject, payload);
  } else {
    li.className = "lagging";
    li.textContent = event + ": " + JSON.stringify(data);
  }
  list.prepend(li);
  while (list.children.length > 200) list.lastChild.remove();
}

async function tail(stream, subject) {
  const controller = new AbortController();
  tailing = controller;
  $("tail-start").disabled = true;
  $("tail-stop").disabled = false;
  let last = null;
  while (tailing === controller) {
    const query = new URLSearchParams();
    if (subject) query.set("subject", subject);
    const extra = last ? { "Last-Event-ID": last } : {};
    $("tail-state").textContent = "tailing " + stream + (subject ? " on " + subject : "") + (last ? " (resumed)" : "");
    try {
      const answer = await fetch("/v1/streams/" + encodeURIComponent(stream) + "/tail?" + query,
        { headers: headers(extra), signal: controller.signal });
      if (!answer.ok) {
        const body = await answer.json().catch(() => null);
        $("tail-state").textContent = explain(body, answer.status);
        break;
      }
      const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      let ended = false;
      while (!ended) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          let event = "message", id = null, data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) event = line.slice(6).trim();
            else if (line.startsWith("id:")) id = line.slice(3).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trim();
          }
          if (!data) continue;
          if (id) last = id;
          show(event, JSON.parse(data));
          if (event !== "message") ended = true;
        }
      }
      if (ended) break;
    } catch (e) {
      if (tailing !== controller) break;
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
  if (tailing === controller) {
    tailing = null;
    $("tail-start").disabled = false;
    $("tail-stop").disabled = true;
    $("tail-state").textContent += " (ended)";
  }
}

$("tail-form").addEventListener("submit", (e) => {
  e.preventDefault();
  if (tailing) tailing.abort();
  $("tail").replaceChildren();
  tail($("tail-stream").value.trim(), $("tail-subject").value.trim());
});

$("tail-stop").addEventListener("click", () => {
  if (tailing) tailing.abort();
  tailing = null;
  $("tail-start").disabled = false;
  $("tail-stop").disabled = true;
  $("tail-state").textContent = "not tailing";
});

$("publish-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const message = {
    subject: $("publish-subject").value.trim(),
    payload: btoa(String.fromCharCode(...new TextEncoder().encode($("publish-payload").value))),
  };
  if ($("publish-id").value.trim()) message.msg_id = $("publish-id").value.trim();
  const answer = await fetch("/v1/messages", {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(message),
  });
  const body = await answer.json().catch(() => null);
  $("publish-result").textContent = answer.ok
    ? "published: " + body.stream + " " + body.partition + "/" + body.seq + (body.duplicate ? " (duplicate)" : "")
    : explain(body, answer.status);
  refresh();
});

$("login").addEventListener("submit", (e) => {
  e.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem("cellog-token", token);
  $("login").hidden = true;
  refresh();
});

refresh();
setInterval(refresh, 2000);
