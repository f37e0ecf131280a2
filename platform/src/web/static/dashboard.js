// The dashboard's only script (served as a file: the Content-Security-Policy allows no inline
// script). Its jobs: copy buttons, times in the browser's zone, and refreshing the region marked
// data-live="URL" every 2 s from that URL, so the owner sees a machine come online without
// reloading.
//
// A live page never shows stale figures as current: the line #live-status says when the region
// was last updated (the time the platform wrote into the fresh region's data-at, ISO 8601 in
// UTC, shown in the browser's zone), or that the connection is lost (the region is then marked
// "stale" and greyed out), or that the session ended (the fetch was redirected to the sign-in
// form), with a link to sign in again. Its texts come from the page itself (data- attributes
// rendered in the page's language): none is here.
"use strict";

// Times (issue 46): the platform writes each as <time datetime="…Z" title="… UTC">… UTC</time>,
// right without this script; here its text becomes the browser's time zone, in the page's
// language, with the zone named ("7 дек. 2026 г., 10:00 GMT+9"); the title keeps the UTC time
// for the pointer. A time marked data-seconds (the live line's) shows the time of day only.
const lang = document.documentElement.lang || undefined;
const formats = {};
function format(seconds) {
  const key = seconds ? "s" : "m";
  if (!formats[key]) {
    formats[key] = new Intl.DateTimeFormat(lang, seconds
      ? { hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short" }
      : { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit",
        timeZoneName: "short" });
  }
  return formats[key];
}
function localTimes(root) {
  root.querySelectorAll("time[datetime]").forEach(function (t) {
    const d = new Date(t.getAttribute("datetime"));
    if (isNaN(d)) return;
    if (!t.title) t.title = t.textContent;
    t.textContent = format(t.hasAttribute("data-seconds")).format(d);
  });
}
document.addEventListener("DOMContentLoaded", function () { localTimes(document); });

// A form refused with why (issue 46): the page opens at the error, beside the field it is
// about (which has the focus), not at the top.
document.addEventListener("DOMContentLoaded", function () {
  const e = document.getElementById("settings-error") || document.querySelector("#alerts .error");
  if (e) e.scrollIntoView({ block: "center" });
});

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

// The line above the live region, in one of its three states.
function liveStatus(state, time) {
  const s = document.getElementById("live-status");
  const live = document.querySelector("[data-live]");
  if (live) live.classList.toggle("stale", state !== "updated");
  if (!s) return;
  s.dataset.state = state;
  s.classList.toggle("bad", state !== "updated");
  if (state === "updated") {
    // "Updated at {time}.": the time as the platform writes one, made local as every other.
    const at = document.createElement("time");
    at.setAttribute("datetime", time || "");
    at.setAttribute("data-seconds", "");
    const d = new Date(time);
    if (!isNaN(d)) at.title = d.toISOString().slice(0, 19).replace("T", " ") + " UTC";
    const parts = s.dataset.updated.split("{time}");
    s.replaceChildren(parts[0], at, parts.slice(1).join(""));
    localTimes(s);
  } else if (state === "lost") {
    s.textContent = s.dataset.lost;
  } else {
    s.textContent = s.dataset.signedOut + " ";
    const a = document.createElement("a");
    a.id = "sign-in-again";
    a.href = s.dataset.login;
    a.textContent = s.dataset.signIn;
    s.appendChild(a);
  }
}

// What the fresh region says about the rest of the page: whether the server is online (its
// command buttons are disabled, with why, when it is not), and whether the join code is still
// open (its install command is removed once the code is used or expires).
function follow(region) {
  if (region.dataset.online) {
    const on = region.dataset.online === "true";
    document.querySelectorAll("button[data-needs-online]").forEach(function (b) { b.disabled = !on; });
    const why = document.getElementById("commands-offline");
    if (why) why.hidden = on;
  }
  if (region.dataset.open === "false") {
    document.querySelectorAll("[data-open-only]").forEach(function (el) { el.remove(); });
  }
}

function refresh() {
  const live = document.querySelector("[data-live]");
  if (!live) return;
  let again = true;
  // A redirect is not followed: the only one a signed-in page answers is to the sign-in form.
  fetch(live.dataset.live, { credentials: "same-origin", cache: "no-store", redirect: "manual" })
    .then(function (r) {
      if (r.type === "opaqueredirect" || r.status === 401) return { signedOut: true };
      return r.ok ? r.text().then(function (text) { return { text: text }; }) : {};
    })
    .then(function (got) {
      if (got.signedOut) {
        again = false;
        liveStatus("signed-out");
        return;
      }
      // Parsed, never executed: the server escaped every value, and a parsed document runs
      // no script.
      const fresh = got.text === undefined ? null
        : new DOMParser().parseFromString(got.text, "text/html").querySelector("[data-live]");
      const now = document.querySelector("[data-live]");
      if (!fresh || !now) {
        liveStatus("lost");
        return;
      }
      const region = document.importNode(fresh, true);
      localTimes(region);
      now.replaceWith(region);
      follow(region);
      liveStatus("updated", region.dataset.at);
    })
    .catch(function () { liveStatus("lost"); })
    .finally(function () { if (again) setTimeout(refresh, 2000); });
}
setTimeout(refresh, 2000);
