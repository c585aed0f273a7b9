package apicheck

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

const version = `{"version":3,"created_at":"2030-01-01T00:00:00Z","author":"user:a","message":"m","rollback_of":null,
	"checksum":"c","domains":["api"],"applied_by":null,"connected":null,"rollout":null}`

// TestCheck runs answers through the console's document: the ones that fit
// pass, and every kind of drift a handler can make is caught.
func TestCheck(t *testing.T) {
	t.Parallel()
	spec, err := Console()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, method, path string
		status             int
		ctype, body        string
		want               string // "" = fits
	}{
		{"fits", "GET", "/api/v1/versions", 200, "application/json", `{"versions":[` + version + `],"next_cursor":null}`, ""},
		{"field renamed", "GET", "/api/v1/versions", 200, "application/json",
			`{"versions":[` + strings.Replace(version, `"created_at"`, `"created"`, 1) + `],"next_cursor":null}`, `property "created"`},
		{"field dropped", "GET", "/api/v1/versions", 200, "application/json",
			`{"versions":[` + strings.Replace(version, `"checksum":"c",`, "", 1) + `],"next_cursor":null}`, `"checksum" is missing`},
		{"field added", "GET", "/api/v1/audit/verify", 200, "application/json", `{"ok":true,"events":2,"chain":"x"}`, `"chain" is unsupported`},
		{"optional field left out", "GET", "/api/v1/audit/verify", 200, "application/json", `{"ok":true,"events":2}`, ""},
		{"wrong type", "GET", "/api/v1/audit/verify", 200, "application/json", `{"ok":"yes","events":2}`, "boolean"},
		{"null not allowed", "GET", "/api/v1/audit/verify", 200, "application/json", `{"ok":true,"events":null}`, "null"},
		{"path parameters", "GET", "/api/v1/versions/3", 200, "application/json",
			`{"version":` + version + `,"domains":[{"name":"api","yaml":"y","version":3,"changed_at":"2030-01-01T00:00:00Z","author":"a","message":"m"}]}`, ""},
		// DomainDetail is allOf DomainRevision and more: closed objects still compose.
		{"allOf", "GET", "/api/v1/domains/api", 200, "application/json",
			`{"name":"api","yaml":"y","version":3,"changed_at":"2030-01-01T00:00:00Z","author":"a","message":"m","current_version":3,
			"config":{"domain":"api","descriptors":[{"key":"k","rate_limit":{"unit":"second","requests_per_unit":5}}]},"limits":[]}`, ""},
		{"allOf drift", "GET", "/api/v1/domains/api", 200, "application/json",
			`{"name":"api","yml":"y","version":3,"changed_at":"2030-01-01T00:00:00Z","author":"a","message":"m","current_version":3,"config":null,"limits":[]}`, `"yml" is unsupported`},
		{"success status not listed", "GET", "/api/v1/audit/verify", 201, "application/json", `{"ok":true,"events":2}`, "status is not supported"},
		{"error status not listed", "GET", "/api/v1/audit/verify", 500, "application/json", `{"error":{"code":"internal","message":"internal error"}}`, ""},
		{"error without envelope", "GET", "/api/v1/audit/verify", 500, "application/json", `{"message":"boom"}`, "envelope"},
		{"error as text", "GET", "/api/v1/audit/verify", 503, "text/plain", `boom`, "envelope"},
		{"listed error", "GET", "/api/v1/versions/9", 404, "application/json", `{"error":{"code":"not_found","message":"no such version"}}`, ""},
		{"content type not declared", "GET", "/api/v1/audit/verify", 200, "text/html", `<p>`, "Content-Type"},
		{"csv", "GET", "/api/v1/audit", 200, "text/csv", "id,at\n1,x\n", ""},
		{"no such operation", "GET", "/api/v1/nope", 200, "text/html", "<p>", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(tt.method, "http://console.test"+tt.path, nil)
			h := http.Header{"Content-Type": {tt.ctype}}
			err := spec.Check(req, tt.status, h, []byte(tt.body))
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Check: %v, want it to fit", err)
			case tt.want != "" && err == nil:
				t.Errorf("Check passed, want an error about %q", tt.want)
			case tt.want != "" && !strings.Contains(err.Error(), tt.want):
				t.Errorf("Check: %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

// recorder is a testing.TB that keeps what Handler reports.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
}

func (r *recorder) Helper() {}
func (r *recorder) Error(args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprint(args...))
}
func (r *recorder) Fatal(args ...any) { panic(fmt.Sprint(args...)) }

// TestHandlerFailsTheTestOnDrift serves a handler that renamed a field of
// its answer: the test it runs in fails, and the client still gets the
// answer as the handler wrote it.
func TestHandlerFailsTheTestOnDrift(t *testing.T) {
	t.Parallel()
	renamed := strings.Replace(version, `"author"`, `"by"`, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Header().Set("X-Test", "kept")
		w.WriteHeader(http.StatusOK)
		if r.URL.Path == "/api/v1/versions/3" {
			fmt.Fprintf(w, `{"version":%s,"domains":[]}`, renamed)
			return
		}
		fmt.Fprintf(w, `{"versions":[%s],"next_cursor":null}`, version)
	})
	rec := &recorder{}
	srv := httptest.NewServer(Handler(rec, h))
	defer srv.Close()

	for path, wantErrors := range map[string]int{"/api/v1/versions": 0, "/api/v1/versions/3": 1} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Test") != "kept" {
			t.Errorf("GET %s = %d %v, want the handler's answer", path, resp.StatusCode, resp.Header)
		}
		rec.mu.Lock()
		got := rec.errors
		rec.errors = nil
		rec.mu.Unlock()
		if len(got) != wantErrors {
			t.Errorf("GET %s: reported %q, want %d errors", path, got, wantErrors)
		}
		for _, e := range got {
			if !strings.Contains(e, `"by"`) || !strings.Contains(e, `"author" is missing`) {
				t.Errorf("GET %s: reported %q, want the renamed field named", path, e)
			}
		}
	}
}
