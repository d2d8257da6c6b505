// Opt-in auto-refresh of a page's figures without reloading it (docs/ui.md, "Every screen").
// A page offers it with a checkbox carrying data-auto-refresh="<seconds>"; once ticked (the choice
// is remembered per page), the page is fetched again every that many seconds and each element
// marked data-refresh (with an id) is replaced by its newer self, unless the operator is using
// it (a ticked box or the focus inside). A file of its own: the UI's Content-Security-Policy runs
// no inline script.
(() => {
  const toggle = document.querySelector("input[data-auto-refresh]");
  if (!toggle) return;
  const seconds = Math.max(2, Number(toggle.dataset.autoRefresh) || 10);
  const key = "auto-refresh:" + location.pathname;
  let timer = null;

  async function refresh() {
    const response = await fetch(location.href, { credentials: "same-origin" });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    for (const old of document.querySelectorAll("[data-refresh][id]")) {
      if (old.querySelector("input:checked") || old.contains(document.activeElement)) continue;
      const replacement = fresh.getElementById(old.id);
      if (replacement) old.replaceWith(document.importNode(replacement, true));
    }
    document.documentElement.dataset.refreshedAt = new Date().toISOString();
  }

  function schedule(on) {
    clearInterval(timer);
    timer = on ? setInterval(() => refresh().catch(() => {}), seconds * 1000) : null;
    localStorage.setItem(key, on ? "on" : "off");
  }

  toggle.checked = localStorage.getItem(key) === "on";
  toggle.addEventListener("change", () => schedule(toggle.checked));
  schedule(toggle.checked);
})();
