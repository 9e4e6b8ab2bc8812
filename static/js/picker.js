// The offer picker's size control: the number input and the quick picks stay in step, and the
// number input alone carries the size, so the URL htmx pushes stays ?gpu=&nodes=&community=.
// Without this file the form still works: see offers.forms.SizeInput.
(() => {
  const form = document.getElementById("picker");
  if (!form) return;
  const number = form.querySelector("input[type=number][name=nodes]");
  const picks = Array.from(form.querySelectorAll("input[data-quick-pick]"));
  picks.forEach((pick) => { pick.name = "size-pick"; });

  // Capture phase: this runs before htmx reads the form on the same change event.
  form.addEventListener("change", (event) => {
    const target = event.target;
    if (target.matches("input[data-quick-pick]")) {
      number.value = target.value;
    } else if (target === number) {
      picks.forEach((pick) => { pick.checked = pick.value === number.value.trim(); });
    }
  }, true);

  if (window.htmx) {
    form.querySelectorAll("[data-without-js]").forEach((el) => { el.hidden = true; });
  }
})();
