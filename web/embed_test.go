package web

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"
)

const testIndex = `<!doctype html><html><head><script type="module" src="/assets/index-ab12.js"></script></head><body><div id="app"></div></body></html>`

func builtFS() fstest.MapFS {
	return fstest.MapFS{
		".gitkeep":              {Data: nil},
		"index.html":            {Data: []byte(testIndex)},
		"favicon.svg":           {Data: []byte(`<svg xmlns="http://www.w3.org/2000/svg"/>`)},
		"assets/index-ab12.js":  {Data: []byte(`console.log("sluice")`)},
		"assets/index-cd34.css": {Data: []byte(`body{margin:0}`)},
	}
}

// notBuiltFS is web/dist in a fresh clone: only the .gitkeep.
func notBuiltFS() fstest.MapFS {
	return fstest.MapFS{".gitkeep": {Data: nil}}
}

type want struct {
	status      int
	cache       string // Cache-Control, "" = don't check
	contentType string // prefix, "" = don't check
	body        string // fragment, "" = don't check
	csp         bool   // Content-Security-Policy set
}

func do(t *testing.T, h http.Handler, method, target string, header http.Header) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func check(t *testing.T, rec *httptest.ResponseRecorder, w want) {
	t.Helper()
	if got := rec.Code; got != w.status {
		t.Fatalf("status = %d, want %d (body %q)", got, w.status, rec.Body.String())
	}
	if w.cache != "" {
		if got := rec.Header().Get("Cache-Control"); got != w.cache {
			t.Errorf("Cache-Control = %q, want %q", got, w.cache)
		}
	}
	if w.contentType != "" {
		if got := rec.Header().Get("Content-Type"); !strings.HasPrefix(got, w.contentType) {
			t.Errorf("Content-Type = %q, want prefix %q", got, w.contentType)
		}
	}
	if w.body != "" && !strings.Contains(rec.Body.String(), w.body) {
		t.Errorf("body = %q, want it to contain %q", rec.Body.String(), w.body)
	}
	if got := rec.Header().Get("Content-Security-Policy") != ""; got != w.csp {
		t.Errorf("Content-Security-Policy set = %v, want %v", got, w.csp)
	}
	if got := rec.Header().Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options = %q, want nosniff", got)
	}
}

func TestBuiltUI(t *testing.T) {
	h := newHandler(builtFS())
	index := want{status: 200, cache: "no-cache", contentType: "text/html", body: `<div id="app">`, csp: true}
	tests := []struct {
		name   string
		method string
		path   string
		want   want
	}{
		{"root serves index", "GET", "/", index},
		{"index by name", "GET", "/index.html", index},
		{"UI route falls back to index", "GET", "/domains/api", index},
		{"UI route with trailing slash", "GET", "/versions/", index},
		{"dot-dot stays inside dist", "GET", "/../../etc/passwd", index},
		{"hashed asset is immutable", "GET", "/assets/index-ab12.js",
			want{status: 200, cache: "public, max-age=31536000, immutable", contentType: "text/javascript", body: `console.log("sluice")`}},
		{"hashed stylesheet", "GET", "/assets/index-cd34.css",
			want{status: 200, cache: "public, max-age=31536000, immutable", contentType: "text/css"}},
		{"other file is revalidated", "GET", "/favicon.svg",
			want{status: 200, cache: "no-cache", contentType: "image/svg+xml"}},
		{"HEAD of an asset", "HEAD", "/assets/index-ab12.js",
			want{status: 200, cache: "public, max-age=31536000, immutable"}},
		{"missing asset is 404, not index", "GET", "/assets/index-old.js", want{status: 404}},
		{"missing file with extension is 404", "GET", "/robots.txt", want{status: 404}},
		{"unknown API path is 404, not index", "GET", "/api/v1/nope", want{status: 404}},
		{"dotfile is never served", "GET", "/.gitkeep", want{status: 404}},
		{"POST is not allowed", "POST", "/", want{status: 405}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := do(t, h, tt.method, tt.path, nil)
			check(t, rec, tt.want)
			if tt.method == "HEAD" && rec.Body.Len() != 0 {
				t.Errorf("HEAD body = %q, want empty", rec.Body.String())
			}
			if tt.want.status == 405 && rec.Header().Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow = %q, want %q", rec.Header().Get("Allow"), "GET, HEAD")
			}
		})
	}
}

func TestRevalidateWithETag(t *testing.T) {
	h := newHandler(builtFS())
	for _, target := range []string{"/", "/domains/api", "/assets/index-ab12.js"} {
		t.Run(target, func(t *testing.T) {
			first := do(t, h, "GET", target, nil)
			etag := first.Header().Get("ETag")
			if etag == "" {
				t.Fatalf("no ETag on %s", target)
			}
			again := do(t, h, "GET", target, http.Header{"If-None-Match": {etag}})
			if got := again.Code; got != http.StatusNotModified {
				t.Errorf("status with If-None-Match = %d, want 304", got)
			}
		})
	}
}

func TestCallerCSPWins(t *testing.T) {
	h := newHandler(builtFS())
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Security-Policy", "default-src 'none'")
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if got := rec.Header().Get("Content-Security-Policy"); got != "default-src 'none'" {
		t.Errorf("Content-Security-Policy = %q, want the caller's", got)
	}
}

func TestNotBuilt(t *testing.T) {
	page := want{status: 200, cache: "no-store", contentType: "text/html", body: "The UI is not built: run <code>make build</code>", csp: true}
	for _, tt := range []struct {
		name string
		fs   fs.FS
	}{
		{"fresh clone", notBuiltFS()},
		{"no dist at all", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHandler(tt.fs)
			for _, c := range []struct {
				path string
				want want
			}{
				{"/", page},
				{"/index.html", page},
				{"/domains/api", page},
				{"/assets/index-ab12.js", want{status: 404}},
				{"/api/v1/me", want{status: 404}},
				{"/.gitkeep", want{status: 404}},
			} {
				t.Run(c.path, func(t *testing.T) {
					check(t, do(t, h, "GET", c.path, nil), c.want)
				})
			}
		})
	}
}

// TestHandler checks the real embedded dist, built or not: both a fresh
// clone (only .gitkeep) and a tree after `npm run build` must serve "/".
func TestHandler(t *testing.T) {
	rec := do(t, Handler(), "GET", "/", nil)
	if _, err := fs.Stat(dist, "dist/index.html"); err == nil {
		check(t, rec, want{status: 200, cache: "no-cache", contentType: "text/html", body: `<div id="app">`, csp: true})
	} else {
		check(t, rec, want{status: 200, cache: "no-store", contentType: "text/html", body: "The UI is not built", csp: true})
	}
}
