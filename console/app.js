// The console's shell: who is signed in, the hash routes (#/, #/list?…, #/tx/<gid>) and the
// search box. Views live in views.js and detail.js.
import { session, whoami, get, txPath, ApiError } from "./api.js";
import { $, show, errorBox, txHref } from "./dom.js";
import { overview, list } from "./views.js";
import { detail } from "./detail.js";

let who = null;
let generation = 0;

function signedIn(identity) {
  who = identity;
  $("who-tenant").textContent = identity.auth === "none" ? "no authentication" : `tenant ${identity.tenant}`;
  $("who-role").textContent = identity.role;
  show($("signout"), identity.auth !== "none");
  for (const id of ["nav", "search", "who"]) show($(id), true);
  show($("login"), false);
}

function signedOut(message) {
  who = null;
  session.token = null;
  for (const id of ["nav", "search", "who"]) show($(id), false);
  $("view").replaceChildren();
  show($("login"), true);
  const err = $("login-error");
  err.textContent = message || "";
  show(err, Boolean(message));
  $("token").focus();
}

function navigate(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

async function route() {
  if (!who) return;
  const mine = ++generation;
  const isCurrent = () => mine === generation;
  const view = $("view");
  const [path, query] = (location.hash.slice(1) || "/").split("?");
  const params = new URLSearchParams(query || "");
  for (const a of document.querySelectorAll("#nav a")) a.classList.remove("current");
  try {
    if (path.startsWith("/tx/")) {
      await detail(view, decodeURIComponent(path.slice(4)), who, isCurrent);
    } else if (path === "/list") {
      $("nav-list").classList.add("current");
      await list(view, params, navigate, who);
    } else {
      $("nav-overview").classList.add("current");
      await overview(view);
    }
  } catch (e) {
    if (!isCurrent()) return;
    if (e instanceof ApiError && e.status === 401) return signedOut(`Signed out: ${e.message}`);
    view.replaceChildren(errorBox(e));
  }
}

async function start() {
  $("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const token = $("token").value.trim();
    try {
      const identity = await whoami(token);
      session.token = token;
      $("token").value = "";
      signedIn(identity);
      route();
    } catch (e) {
      const err = $("login-error");
      err.textContent = e.status === 401 ? `This token is not accepted: ${e.message}` : e.message;
      show(err, true);
    }
  });
  $("signout").addEventListener("click", (ev) => {
    ev.preventDefault();
    signedOut();
    history.replaceState(null, "", "#/");
  });
  $("search").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const gid = $("search-gid").value.trim();
    if (!gid) return;
    try {
      await get(txPath(gid));
      $("search-gid").value = "";
      navigate(txHref(gid));
    } catch (e) {
      $("view").replaceChildren(errorBox(e.status === 404 ? new ApiError(404, "not_found", `No transaction ${gid}.`) : e));
    }
  });
  window.addEventListener("hashchange", route);

  // A server without authentication answers without a token; otherwise the tab's token, if
  // it still works, or the form.
  const saved = session.token;
  try {
    signedIn(await whoami(saved));
    route();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) signedOut(saved ? "Your token is no longer accepted." : "");
    else signedOut(e.message);
  }
}

start();
