// The API docs (templates/ninja/swagger.html): Swagger UI's own dark theme (html.dark-mode in
// its stylesheet) follows the reader's colour scheme, as the rest of the dashboard does.
(() => {
  const dark = window.matchMedia("(prefers-color-scheme: dark)");
  const follow = () => document.documentElement.classList.toggle("dark-mode", dark.matches);
  follow();
  dark.addEventListener("change", follow);
})();
