/* The page's requests to its own server: JSON in, the server's error message out. */

export async function errorText(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (err) { /* not JSON */ }
  return "HTTP " + response.status;
}

export async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  if (!response.ok) {
    const err = new Error(await errorText(response));
    err.status = response.status;
    throw err;
  }
  return response.json();
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
