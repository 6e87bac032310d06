// dsh view: the page's only script (served from this package; the CSP forbids inline script).
// Every HTML fragment it inserts was rendered and escaped by the server; session text is never
// turned into markup here.
"use strict";

(function () {
  // A permalink to a seq that is not on this page: ask the server for the page holding it.
  function followPermalink() {
    var match = /^#seq-(\d+)$/.exec(window.location.hash);
    var main = document.querySelector("main.session");
    if (!match || !main || document.getElementById("seq-" + match[1])) return;
    var url = new URL(window.location.href);
    if (url.searchParams.get("at") === match[1]) return;
    url.searchParams.delete("start");
    url.searchParams.set("at", match[1]);
    window.location.replace(url.toString());
  }

  function loadModel(src) {
    var pane = document.getElementById("model-body");
    if (!pane) return;
    pane.setAttribute("aria-busy", "true");
    fetch(src, { credentials: "same-origin" })
      .then(function (r) { return r.text().then(function (t) { return [r.ok, t]; }); })
      .then(function (res) {
        pane.innerHTML = res[1];
        pane.removeAttribute("aria-busy");
        loadParts(pane);
      })
      .catch(function (err) {
        pane.textContent = "The model view could not be loaded: " + err;
      });
  }

  // A part of the model view the server folds apart (the request header of a log without a
  // restore point): shown in place when it arrives, unless another view replaced the pane.
  function loadParts(pane) {
    pane.querySelectorAll(".model-header[data-src]").forEach(function (part) {
      fetch(part.dataset.src, { credentials: "same-origin" })
        .then(function (r) { return r.text(); })
        .then(function (html) {
          if (!part.isConnected) return;
          part.innerHTML = html;
          part.removeAttribute("data-src");
          part.classList.add("loaded");
        })
        .catch(function (err) {
          part.textContent = "The request header could not be loaded: " + err;
        });
    });
  }

  function wireModelLinks(root) {
    root.querySelectorAll("a.js-model").forEach(function (link) {
      if (link.dataset.wired) return;
      link.dataset.wired = "1";
      link.addEventListener("click", function (ev) {
        if (!document.getElementById("model-body")) return;
        ev.preventDefault();
        loadModel(link.dataset.fragment);
        document.querySelectorAll(".entry.selected").forEach(function (e) {
          e.classList.remove("selected");
        });
        var article = link.closest(".entry");
        if (article) article.classList.add("selected");
      });
    });
  }

  function live(main) {
    var url = main.dataset.live;
    if (!url || !window.EventSource) return;
    var entries = document.getElementById("entries");
    var source = new EventSource(url);
    source.addEventListener("entries", function (ev) {
      var open = entries.querySelectorAll(".k-open-turn");
      open.forEach(function (e) { e.remove(); });
      entries.insertAdjacentHTML("beforeend", ev.data);
      wireModelLinks(entries);
      main.classList.add("updated");
    });
    source.addEventListener("count", function (ev) {
      var count = document.getElementById("event-count");
      if (count) count.textContent = Number(ev.data).toLocaleString("en-US");
    });
    source.addEventListener("damage", function (ev) {
      var note = document.createElement("div");
      note.className = "damage";
      note.textContent = "Live updates stopped: " + ev.data;
      entries.appendChild(note);
      source.close();
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    followPermalink();
    window.addEventListener("hashchange", followPermalink);
    var pane = document.getElementById("model");
    if (pane && pane.dataset.src) loadModel(pane.dataset.src);
    loadParts(document);  // a model view page of its own
    wireModelLinks(document);
    var main = document.querySelector("main.session");
    if (main) live(main);
  });
})();
