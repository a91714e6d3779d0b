"use strict";
// The login form: POST /api/login sets the session cookie (HttpOnly), then the console opens.
document.getElementById("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const error = document.getElementById("login-error");
  error.textContent = "";
  const answer = await fetch("/api/login", {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-Flightstore-Console": "1"},
    body: JSON.stringify({user: document.getElementById("user").value,
                          password: document.getElementById("password").value}),
  });
  if (answer.ok) {
    window.location.assign("/#/tables");
  } else {
    const body = await answer.json().catch(() => ({}));
    error.textContent = body.error || ("login failed (" + answer.status + ")");
  }
});
