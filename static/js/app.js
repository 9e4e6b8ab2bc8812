// Small progressive enhancements; every page works without this file.
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const source = document.getElementById(button.dataset.copy);
  const text = source ? source.innerText : button.dataset.copyText;
  navigator.clipboard.writeText(text).then(() => {
    const label = button.textContent;
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = label; }, 1500);
  });
});

// Countdowns: an element with `data-deadline` (an ISO instant) shows the time left to it and
// moves every second on its own, so no poll is needed to move a clock. The count is in the
// server's clock: `data-server-now` says what time the server had when it rendered the page
// (or the poll's answer), and the difference to this browser's clock is kept (a clock set
// wrong must not show a deadline minutes off). The words are the server's: the same element's
// `data-countdown-format` holds runcrate/durations.py's COUNTDOWN_FORMAT, which this fills with
// the same rounding (whole units, down), so the clock says what the server would.
(() => {
  let skew = 0; // the server's clock minus this browser's, in milliseconds
  let stamp = null;
  let format = null;

  function duration(seconds) {
    const h = Math.floor(seconds / 3600);
    const m = Math.floor((seconds % 3600) / 60);
    const s = seconds % 60;
    const shape = format[h ? "hours" : m ? "minutes" : "seconds"];
    const values = { h, m, s, ss: String(s).padStart(2, "0") };
    return shape.replace(/\{(\w+)\}/g, (_, name) => String(values[name]));
  }

  function tick() {
    const rendered = document.querySelector("[data-server-now]");
    if (rendered && rendered.dataset.serverNow !== stamp) {
      stamp = rendered.dataset.serverNow;
      skew = Date.parse(stamp) - Date.now();
    }
    if (rendered && rendered.dataset.countdownFormat) {
      format = JSON.parse(rendered.dataset.countdownFormat);
    }
    if (!format) return; // nothing says how to word the time left: keep the server's text
    const now = Date.now() + skew;
    for (const element of document.querySelectorAll("[data-deadline]")) {
      const left = Math.max(0, Math.floor((Date.parse(element.dataset.deadline) - now) / 1000));
      // An estimate words it otherwise: `data-prefix` and `data-suffix` (instead of " left"):
      // "in about 4m 10s"; and `data-overdue` shows once its time is up.
      const prefix = element.dataset.prefix ?? "";
      const suffix = element.dataset.suffix ?? " left";
      const overdue = left === 0 && element.dataset.overdue;
      const text = overdue || `${prefix}${duration(left)}${suffix}`;
      if (element.textContent !== text) element.textContent = text;
    }
  }

  if (!document.querySelector("[data-deadline], [data-server-now]")) return;
  tick();
  setInterval(tick, 1000);
  document.body.addEventListener("htmx:afterSettle", tick);
})();

// The phone's menu (a <details> in the top bar) opens and closes without this; with it, Escape
// and a click outside the menu close it too, as a menu is expected to.
(() => {
  const menu = document.querySelector(".nav-menu");
  if (!menu) return;
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && menu.open) {
      menu.open = false;
      menu.querySelector("summary").focus();
    }
  });
  document.addEventListener("click", (event) => {
    if (menu.open && !menu.contains(event.target)) menu.open = false;
  });
})();

// Times: a `<time datetime data-when>` (runcrate/templatetags/times.py) holds the UTC date and
// time; here it reads in this browser's zone and language. `data-when="relative"` says "3 min
// ago" while that is under a day (the full local time in its title), the date and time after.
(() => {
  const full = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" });
  const relative = typeof Intl.RelativeTimeFormat === "function"
    ? new Intl.RelativeTimeFormat(undefined, { numeric: "auto" }) : null;

  function ago(seconds) {
    if (seconds < 60) return relative.format(-seconds, "second");
    if (seconds < 3600) return relative.format(-Math.floor(seconds / 60), "minute");
    return relative.format(-Math.floor(seconds / 3600), "hour");
  }

  function show(root) {
    for (const element of root.querySelectorAll("time[data-when]")) {
      const at = new Date(element.getAttribute("datetime"));
      if (Number.isNaN(at.getTime())) continue;
      const local = full.format(at);
      const seconds = Math.max(0, Math.floor((Date.now() - at.getTime()) / 1000));
      const text = element.dataset.when === "relative" && relative && seconds < 86_400
        ? ago(seconds) : local;
      if (element.textContent !== text) element.textContent = text;
      element.title = local;
    }
  }

  show(document);
  document.body.addEventListener("htmx:afterSettle", () => show(document));
  setInterval(() => show(document), 30_000);
})();

// The cost so far and the uptime of a running cluster move every second, in the server's
// words: #cluster-cost's `data-cost-ahead` lists, for the coming seconds, what they read from
// then on ([seconds after it was drawn, cost, uptime], billing.usage.ClusterCost.ahead: the
// meter's rounding, runcrate/money.py and runcrate/durations.py's wording). This shows the
// row whose time has come and computes nothing; the next poll's answer draws them anew.
(() => {
  let drawn = null; // the element the server drew, its rows, and when this browser saw it
  function tick() {
    const element = document.querySelector("#cluster-cost[data-cost-ahead]");
    if (!element) return;
    if (!drawn || drawn.element !== element) {
      drawn = { element, at: Date.now(), rows: JSON.parse(element.dataset.costAhead) };
    }
    const elapsed = (Date.now() - drawn.at) / 1000;
    let row = null;
    for (const next of drawn.rows) {
      if (next[0] > elapsed) break;
      row = next;
    }
    if (!row) return; // the server's own text stands
    const [, text, up] = row;
    const figure = element.querySelector(".cost-figure");
    const uptime = element.querySelector(".cost-uptime");
    if (figure && figure.textContent !== text) figure.textContent = text;
    if (uptime && uptime.textContent !== up) uptime.textContent = up;
  }

  if (!document.querySelector("#cluster-cost")) return;
  setInterval(tick, 1000);
  document.body.addEventListener("htmx:afterSettle", tick);
})();

// A `<details data-keep-open id>` in a panel the poll redraws stays as the user left it (open
// or closed) across the redraws: the server draws it closed, this remembers each toggle by id.
(() => {
  const kept = new Map();
  document.addEventListener("toggle", (event) => {
    const details = event.target;
    if (details instanceof HTMLDetailsElement && details.id && "keepOpen" in details.dataset) {
      kept.set(details.id, details.open);
    }
  }, true);
  document.body.addEventListener("htmx:afterSettle", () => {
    for (const [id, open] of kept) {
      const details = document.getElementById(id);
      if (details instanceof HTMLDetailsElement && details.open !== open) details.open = open;
    }
  });
})();

// The Metrics tab's figures (issue 38): when only the figures moved, the poll sends them as
// JSON (#metrics-now, clusters/web/heatmap.py `figures_now`) and nothing else of the panel;
// this draws them into the cells and the table the page has, in their order (a column of
// cells per node, a cell per GPU it reported; a row per node, a cell per GPU). Every class
// and word is the server's, looked up here: a GPU sends, per figure, the key of its words
// (`words`: its level and text), the cell's class is `classes[silent][level]`, its title
// the title's wording (`title`) of the text; the heatmaps' spoken words. A node sent as null
// keeps its outlines.
(() => {
  let drawn = null; // the #metrics-now element last drawn

  function draw() {
    const source = document.getElementById("metrics-now");
    if (!source || source === drawn) return;
    drawn = source;
    const figures = JSON.parse(source.textContent);
    if (!figures) return;
    const maps = [...document.querySelectorAll(".heatmap-grid")];
    const cells = maps.map((map) => map.querySelectorAll("rect"));
    const rows = document.querySelectorAll("#metrics-every-gpu tbody tr");
    maps.forEach((map, i) => map.setAttribute("aria-label", figures.labels[i]));
    for (const entry of document.querySelectorAll(".heat-legend .legend-silent")) {
      entry.hidden = !figures.silent;
    }
    let at = 0; // the cell of each heatmap the next GPU's is
    figures.nodes.forEach(([name, since, quiet, gpus], n) => {
      if (!gpus) {
        at += figures.rows; // its outlines, one a row
        return;
      }
      const classes = figures.classes[quiet];
      const row = rows[n] ? rows[n].querySelectorAll("td") : [];
      for (const gpu of gpus) {
        const index = gpu[0];
        const said = figures.words.map((words, i) => words[gpu[1 + i]]); // [level, text]
        cells.forEach((mapCells, i) => {
          const cell = mapCells[at];
          if (!cell) return;
          const [level, text] = said[i];
          const css = classes[level];
          if (cell.getAttribute("class") !== css) cell.setAttribute("class", css);
          const title = figures.title.replace("{node}", name).replace("{gpu}", index)
            .replace("{figure}", text).replace("{since}", since);
          const words = cell.querySelector("title");
          if (words && words.textContent !== title) words.textContent = title;
        });
        at += 1;
        const td = row[index];
        if (td) {
          const parts = [td.firstChild, ...td.querySelectorAll("span")];
          parts.forEach((part, i) => {
            const text = said[i][1];
            if (part && part.textContent !== text) part.textContent = text;
          });
        }
      }
    });
  }

  document.body.addEventListener("htmx:afterRequest", draw);
  document.body.addEventListener("htmx:afterSettle", draw);
})();
