// The pyrula dashboard's script: live regions over server-sent events, confirmed actions
// through the JSON API, keyboard use. Everything it shows comes from the server, already
// escaped: it sets innerHTML only with the server's own rendering of the page.
"use strict";
(function () {
  const body = document.body;
  const prefix = body.dataset.prefix || "";
  const live = document.getElementById("live");
  const msg = document.getElementById("msg");
  let selected = -1;

  function say(text, ok) {
    msg.textContent = text;
    msg.className = "msg " + (ok ? "ok" : "err");
  }

  function rows() {
    const table = live && live.querySelector("table tbody");
    return table ? Array.from(table.rows) : [];
  }

  function select(index) {
    const all = rows();
    all.forEach((row) => row.classList.remove("sel"));
    if (!all.length) { selected = -1; return; }
    selected = Math.max(0, Math.min(index, all.length - 1));
    all[selected].classList.add("sel");
    all[selected].scrollIntoView({ block: "nearest" });
  }

  // -- live ------------------------------------------------------------------------
  if (live && body.dataset.live) {
    const path = location.pathname.slice(prefix.length) + location.search;
    const stream = new EventSource(prefix + "/api/live?path=" + encodeURIComponent(path));
    stream.onmessage = (event) => {
      live.innerHTML = event.data;
      body.dataset.updates = String(Number(body.dataset.updates || 0) + 1);
      if (selected >= 0) select(selected);
    };
    stream.addEventListener("gone", (event) => { say(event.data, false); stream.close(); });
    stream.addEventListener("trouble", (event) => say(event.data, false));
  }

  // -- actions ---------------------------------------------------------------------
  async function post(action, payload) {
    const response = await fetch(prefix + action, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(payload),
      credentials: "same-origin",
    });
    let data = {};
    try { data = await response.json(); } catch (e) { data = { error: response.statusText }; }
    return { ok: response.ok, data };
  }

  async function follow(job) {
    const bar = document.getElementById("bulk-progress");
    const line = document.getElementById("bulk-status");
    bar.hidden = false;
    for (;;) {
      const response = await fetch(prefix + "/api/bulk/" + job, { credentials: "same-origin" });
      const p = await response.json();
      bar.value = p.percent;
      line.textContent = ` ${p.action}: ${p.done} done, ${p.skipped} skipped, ` +
        `${p.failed} failed of ${p.selected}` + (p.finished ? " (finished)" : "");
      line.dataset.finished = p.finished ? "1" : "";
      if (p.finished) return;
      await new Promise((resolve) => setTimeout(resolve, 300));
    }
  }

  function outcome(data) {
    if (data.purged !== undefined) return `queue ${data.queue}: ${data.purged} runs cancelled`;
    if (data.run) return `run ${data.run.run_id} (${data.run.workflow}): ${data.run.status}`;
    if (data.schedule) return `schedule ${data.schedule.schedule_id}: ` +
      (data.schedule.enabled ? "active" : "paused");
    return "done";
  }

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button.act");
    if (!button) return;
    if (!window.confirm(button.dataset.confirm)) return;
    const payload = button.dataset.body ? JSON.parse(button.dataset.body) : {};
    const { ok, data } = await post(button.dataset.action, payload);
    if (!ok) { say(data.error || "failed", false); return; }
    if (button.dataset.bulk) {
      say(`bulk ${data.action} started: ${data.selected} runs selected`, true);
      follow(data.job);
    } else {
      say(outcome(data), true);
    }
  });

  function fields(form) {
    const out = {};
    new FormData(form).forEach((value, key) => { out[key] = String(value); });
    return out;
  }

  for (const form of document.querySelectorAll("form[data-action]")) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const line = form.querySelector(".form-msg");
      if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) return;
      const payload = fields(form);
      if (form.id === "submit-form") {
        payload.params_text = payload.params;
        delete payload.params;
      }
      const { ok, data } = await post(form.dataset.action, payload);
      line.className = "msg form-msg " + (ok ? "ok" : "err");
      if (!ok) { line.textContent = data.error || "failed"; return; }
      line.textContent = "";
      if (data.run && form.id === "submit-form") {
        const link = document.createElement("a");
        link.href = prefix + "/runs/" + encodeURIComponent(data.run.run_id);
        link.textContent = (data.created ? "submitted " : "found ") + data.run.run_id;
        line.appendChild(link);
      } else {
        line.textContent = outcome(data);
      }
    });
  }

  const names = document.getElementById("param-names");
  const workflowInput = document.querySelector("#submit-form input[name=workflow]");
  if (names && workflowInput) {
    const known = JSON.parse(names.dataset.names || "{}");
    workflowInput.addEventListener("input", () => {
      const params = known[workflowInput.value];
      names.textContent = params === undefined ? "" :
        params === null ? "(parameters not known: its module is not imported here)" :
        "parameters: " + (params.length ? params.join(", ") : "none");
    });
  }

  // -- keys ------------------------------------------------------------------------
  const pagesByKey = { o: "/overview", u: "/", w: "/workers", q: "/queues", s: "/schedules",
                       e: "/owners", d: "/dead" };
  let pendingG = false;
  document.addEventListener("keydown", (event) => {
    const typing = event.target.closest("input, textarea, select");
    if (typing) {
      if (event.key === "Escape") event.target.blur();
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const key = event.key;
    if (pendingG) {
      pendingG = false;
      if (pagesByKey[key]) location.href = prefix + pagesByKey[key];
      return;
    }
    const clickIn = (scope, selector) => {
      const found = scope && scope.querySelector(selector);
      if (found) found.click();
      return Boolean(found);
    };
    const row = rows()[selected];
    switch (key) {
      case "g": pendingG = true; break;
      case "/": event.preventDefault(); document.getElementById("search")?.focus(); break;
      case "j": select(selected + 1); break;
      case "k": select(selected - 1); break;
      case "Enter": if (row) clickIn(row, "a"); break;
      case "n": clickIn(live, "a.next"); break;
      case "p": clickIn(live, "a.prev"); break;
      case "x": event.preventDefault(); document.getElementById("signal-name")?.focus(); break;
      case "?": { const help = document.getElementById("keys"); help.hidden = !help.hidden; break; }
      default:
        if (row && clickIn(row, `button[data-key="${key}"]`)) break;
        clickIn(document.getElementById("actions"), `button[data-key="${key}"]`);
    }
  });
  body.dataset.ready = "1";
})();
