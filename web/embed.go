// Package web serves the console's single-page UI.
//
// The UI's source lives in web/src (Svelte 5 + TypeScript); Vite builds it into
// web/dist, which is embedded into the binary at compile time. The build output
// is not committed (only web/dist/.gitkeep is), so a fresh clone still builds
// and tests without Node: the handler then answers with a short page saying how
// to build the UI. `make build` and `make run` build the UI first.
package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed all:dist
var dist embed.FS

// ContentSecurityPolicy is sent with every HTML page of the UI unless the
// caller already set one. The Vite build has no inline scripts or styles and
// loads nothing from other origins, so everything is 'self'.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; " +
	"img-src 'self'; font-src 'self'; connect-src 'self'; object-src 'none'; " +
	"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Cache policies. Files under assets/ carry a content hash in their name, so
// they never change; everything else is revalidated with its ETag.
const (
	cacheImmutable  = "public, max-age=31536000, immutable"
	cacheRevalidate = "no-cache"
	cacheNever      = "no-store"
)

const notBuiltPage = `<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Sluice: the UI is not built</title></head>
<body>
<h1>Sluice console</h1>
<p>The UI is not built: run <code>make build</code> (or <code>npm ci &amp;&amp; npm run build</code>), then rebuild and restart the console.</p>
<p>The API under <code>/api/v1</code> works without it.</p>
</body>
</html>
`

// Handler returns the http.Handler that serves the embedded UI: files from
// web/dist, index.html for any other path that does not look like a file (so
// the UI's own routes survive a reload), and 404 for missing assets and for
// anything under /api/. Mount it as the router's fallback (gin's NoRoute).
func Handler() http.Handler {
	files, err := fs.Sub(dist, "dist")
	if err != nil {
		// Unreachable: "dist" is a constant, valid path. Serve the
		// not-built page rather than crash a console over its UI.
		return newHandler(nil)
	}
	return newHandler(files)
}

// file is one embedded file, read once at start-up.
type file struct {
	data []byte
	etag string
}

// spa serves a built single-page app from an fs.FS.
type spa struct {
	files map[string]file // by slash-separated name relative to dist, e.g. "assets/index-ab12.js"
	built bool            // dist has an index.html
}

// newHandler reads every file of files into memory (the UI is small) and
// computes its ETag. A nil files means "not built".
func newHandler(files fs.FS) *spa {
	h := &spa{files: make(map[string]file)}
	if files != nil {
		// Errors only skip the file concerned: it is then answered with 404.
		_ = fs.WalkDir(files, ".", func(name string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || hidden(name) {
				return nil
			}
			data, err := fs.ReadFile(files, name)
			if err != nil {
				return nil
			}
			sum := sha256.Sum256(data)
			h.files[name] = file{data: data, etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
			return nil
		})
	}
	_, h.built = h.files["index.html"]
	return h
}

// ServeHTTP implements http.Handler.
func (h *spa) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}

	// path.Clean on a rooted path removes every "..", so name never
	// escapes dist; "/" becomes "".
	name := strings.TrimPrefix(path.Clean("/"+r.URL.Path), "/")
	if name == "" {
		name = "index.html"
	}

	if f, ok := h.files[name]; ok {
		cache := cacheRevalidate
		if strings.HasPrefix(name, "assets/") {
			cache = cacheImmutable
		}
		h.serve(w, r, name, f, cache)
		return
	}

	switch {
	case name == "api" || strings.HasPrefix(name, "api/"),
		// An unknown API path must not get the UI's HTML with a 200.
		strings.HasPrefix(name, "assets/"),
		// A missing asset gets 404, never index.html: a browser would try
		// to run HTML as JavaScript and hide the real problem.
		hidden(name),
		name != "index.html" && path.Ext(name) != "":
		http.NotFound(w, r)
	case !h.built:
		w.Header().Set("Cache-Control", cacheNever)
		setHTMLHeaders(w)
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, _ = w.Write([]byte(notBuiltPage))
		}
	default:
		// A route of the UI itself, like /domains/api: the app routes it.
		h.serve(w, r, "index.html", h.files["index.html"], cacheRevalidate)
	}
}

// serve writes one file; http.ServeContent answers HEAD, Range and
// If-None-Match (304) from the ETag set here.
func (h *spa) serve(w http.ResponseWriter, r *http.Request, name string, f file, cache string) {
	w.Header().Set("Cache-Control", cache)
	w.Header().Set("ETag", f.etag)
	if path.Ext(name) == ".html" {
		setHTMLHeaders(w)
	}
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(f.data))
}

func setHTMLHeaders(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if w.Header().Get("Content-Security-Policy") == "" {
		w.Header().Set("Content-Security-Policy", ContentSecurityPolicy)
	}
}

// hidden reports whether any element of name starts with a dot, like the
// .gitkeep that keeps web/dist in git. Those are never served.
func hidden(name string) bool {
	for elem := range strings.SplitSeq(name, "/") {
		if strings.HasPrefix(elem, ".") && elem != "." {
			return true
		}
	}
	return false
}
