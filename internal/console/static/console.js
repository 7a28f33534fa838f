// Nudge console: the only script the Content Security Policy allows. Two jobs:
// the overview refreshes its figures every 15 seconds (the page is fetched
// again and its live part swapped in), and a confirmation is shown as a modal
// dialog. Everything works without it.
"use strict";
(function () {
  var page = document.body.getAttribute("data-page");
  if (page === "overview") {
    setInterval(function () {
      fetch(location.href, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          var next = new DOMParser().parseFromString(html, "text/html").getElementById("live");
          var live = document.getElementById("live");
          if (next && live) { live.replaceWith(next); }
        })
        .catch(function () { /* keep the figures shown; the next tick tries again */ });
    }, 15000);
  }
  var dialog = document.getElementById("confirm");
  if (dialog && typeof dialog.showModal === "function") {
    dialog.removeAttribute("open");
    dialog.showModal();
    dialog.addEventListener("cancel", function () {
      location.href = document.getElementById("confirm-cancel").getAttribute("href");
    });
  }
})();
