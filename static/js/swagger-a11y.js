// The API docs (templates/ninja/swagger.html): Swagger UI's markup, mended where it breaks the
// accessibility rules the dashboard keeps (docs/accessibility.md, "The API docs"). It runs on
// every change Swagger UI makes to its region, and changes only attributes, never the elements
// React keeps, so Swagger UI goes on rendering them.
(() => {
  const root = document.getElementById("swagger-ui");
  if (!root) return;

  const mend = () => {
    // Each operation's summary is a button; its path inside is a deep link (<a href>), a
    // control inside a control (axe's nested-interactive). The button already opens the
    // operation and puts its deep link in the address bar, so the inner link loses its href.
    for (const link of root.querySelectorAll("button a[href]")) {
      link.dataset.deepLink = link.getAttribute("href");
      link.removeAttribute("href");
    }
    // A parameter's choices (an enum, a boolean) are a <select> with no label: named for the
    // parameter it sets.
    for (const select of root.querySelectorAll(".parameters-col_description select:not([aria-label])")) {
      const name = select.closest("tr")?.querySelector(".parameter__name");
      if (name) select.setAttribute("aria-label", name.textContent.replace("*", "").trim());
    }
    // An example's code scrolls sideways in its own box: a keyboard reaches it to scroll it
    // (axe's scrollable-region-focusable), as the dashboard's tables do.
    for (const code of root.querySelectorAll(".highlight-code > pre:not([tabindex])")) {
      code.setAttribute("tabindex", "0");
    }
  };

  mend();
  new MutationObserver(mend).observe(root, { childList: true, subtree: true });
})();
