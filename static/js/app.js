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
