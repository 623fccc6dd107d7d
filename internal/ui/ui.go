// Package ui is the dashboard `controller serve` serves at /ui/: static
// files embedded in the binary (plain HTML, CSS and JavaScript modules; no
// build step, nothing from a CDN). The page signs in with an API token when
// the API has --tokens (kept in sessionStorage, sent as Authorization:
// Bearer), reads the API like any client, and updates itself from the event
// stream GET /v1/events.
package ui

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// Files are the dashboard's files, at the root (index.html, app.js, ...).
func Files() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the directory is embedded above
	}
	return sub
}

// CSP lets the page load only its own files and talk only to its own origin:
// no inline script, nothing from elsewhere, no framing.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the files under /ui/.
func Handler() http.Handler {
	files := http.StripPrefix("/ui/", http.FileServerFS(Files()))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
