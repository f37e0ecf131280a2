// The dashboard's only script (served as a file: the Content-Security-Policy allows no inline
// script). Two jobs: copy buttons, and refreshing the region marked data-live="URL" every 2 s
// from that URL, so the owner sees a machine come online without reloading.
"use strict";

document.addEventListener("click", function (e) {
  const b = e.target.closest("button[data-copy]");
  if (!b) return;
  const el = document.getElementById(b.dataset.copy);
  if (!el) return;
  const done = function () { b.textContent = b.dataset.done; };
  const select = function () {
    const r = document.createRange();
    r.selectNodeContents(el);
    const s = window.getSelection();
    s.removeAllRanges();
    s.addRange(r);
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(el.textContent).then(done, select);
  } else {
    select();
  }
});

function refresh() {
  const live = document.querySelector("[data-live]");
  if (!live) return;
  fetch(live.dataset.live, { credentials: "same-origin", cache: "no-store" })
    .then(function (r) { return r.ok ? r.text() : null; })
    .then(function (text) {
      if (text === null) return;
      // Parsed, never executed: the server escaped every value, and a parsed document runs
      // no script.
      const fresh = new DOMParser().parseFromString(text, "text/html").querySelector("[data-live]");
      const now = document.querySelector("[data-live]");
      if (fresh && now) now.replaceWith(document.importNode(fresh, true));
    })
    .catch(function () {})
    .finally(function () { setTimeout(refresh, 2000); });
}
setTimeout(refresh, 2000);
