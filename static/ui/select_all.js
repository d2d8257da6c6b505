// "Select all on this page" of a list whose rows have checkboxes (the dead jobs list): a box with
// data-select-all="<name>" ticks or clears every checkbox of that name in its form, and shows
// whether all, some or none of them are ticked. Without script it could do nothing, so it starts
// hidden and is shown here. A file of its own: the UI's Content-Security-Policy runs no inline
// script (ui/csp.py). Listening on the document, it still works once auto-refresh (refresh.js)
// has replaced the rows.
(() => {
  const toggles = () => document.querySelectorAll("input[data-select-all]");
  const rowsOf = (toggle) =>
    toggle.form
      ? [...toggle.form.elements].filter(
          (element) => element.type === "checkbox" && element.name === toggle.dataset.selectAll,
        )
      : [];

  function show(toggle) {
    const rows = rowsOf(toggle);
    const ticked = rows.filter((row) => row.checked).length;
    toggle.checked = rows.length > 0 && ticked === rows.length;
    toggle.indeterminate = ticked > 0 && ticked < rows.length;
  }

  for (const toggle of toggles()) {
    toggle.closest("[hidden]")?.removeAttribute("hidden");
    show(toggle);
  }
  document.addEventListener("change", (event) => {
    const changed = event.target;
    for (const toggle of toggles()) {
      if (changed === toggle) {
        for (const row of rowsOf(toggle)) row.checked = toggle.checked;
      } else if (changed.form === toggle.form && changed.name === toggle.dataset.selectAll) {
        show(toggle);
      }
    }
  });
})();
