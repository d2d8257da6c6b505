// Asks before submitting a form that has a data-confirm question (replay, delete, cancel).
// A file of its own rather than onsubmit attributes: the UI's Content-Security-Policy runs no
// inline script (ui/csp.py).
document.addEventListener("submit", (event) => {
  const question = event.target.dataset.confirm;
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
