// The consumer pages' conveniences (docs/ui-consumers.md). A file of its own: the UI's
// Content-Security-Policy runs no inline script (ui/csp.py). The pages work without it.
(() => {
  // Copy buttons (the token and the secret shown once): a button[data-copy] copies the text of
  // the element whose id it names. Hidden in the page, shown here: without script there is no
  // button that does nothing.
  for (const button of document.querySelectorAll("button[data-copy]")) {
    const source = document.getElementById(button.dataset.copy);
    if (!source) continue;
    const label = button.textContent;
    button.hidden = false;
    button.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(source.textContent.trim());
        button.textContent = "Copied";
      } catch {
        // No clipboard access (an insecure origin, a refused permission): select the text,
        // so that the operator's own copy takes it.
        window.getSelection().selectAllChildren(source);
        button.textContent = "Selected: press Ctrl+C";
      }
      setTimeout(() => { button.textContent = label; }, 2000);
    });
  }

  // The new consumer's event type catalogue: only the typed channel's entries are offered. The
  // others are disabled too, so that they are not posted (the server refuses another channel's).
  const channel = document.querySelector("input[list='channel-suggestions']");
  const groups = document.querySelectorAll(".catalogue-group[data-channel]");
  if (!channel || !groups.length) return;
  const none = document.querySelector(".catalogue-none");
  function offer() {
    let shown = 0;
    for (const group of groups) {
      const mine = group.dataset.channel === channel.value.trim();
      group.hidden = !mine;
      group.disabled = !mine;
      shown += mine ? 1 : 0;
    }
    if (none) none.hidden = shown > 0 || !channel.value.trim();
  }
  channel.addEventListener("input", offer);
  offer();
})();
