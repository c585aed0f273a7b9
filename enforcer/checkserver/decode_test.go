package checkserver_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/checkserver"
)

// sendOpen posts head as the start of a body that never ends (the client
// keeps the connection open, as a slow attacker does) and returns the
// answer, or fails when none comes within 10 s.
func sendOpen(t *testing.T, url, head string, contentLength int64) (int, string) {
	t.Helper()
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	req, err := http.NewRequest("POST", url, pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = contentLength
	req.Header.Set("Content-Type", "application/json")
	go func() { io.WriteString(pw, head) }() // blocks once the server stops reading
	// Without an answer in 10 s, end the body (the client's timeout alone
	// does not unblock a transport still sending it).
	timer := time.AfterFunc(10*time.Second, func() { pw.CloseWithError(errors.New("no answer in 10 s")) })
	defer timer.Stop()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("no answer while the body was still open: %v", err)
	}
	if !timer.Stop() {
		t.Fatalf("answered only after the body ended")
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// descriptors is n descriptors of e entries each, JSON, comma-separated.
func descriptors(n, e int, value string) string {
	ds := make([]string, n)
	for i := range ds {
		es := make([]string, e)
		for j := range es {
			es[j] = fmt.Sprintf(`{"key":"user","value":"%s%d"}`, value, i)
		}
		ds[i] = `{"entries":[` + strings.Join(es, ",") + `]}`
	}
	return strings.Join(ds, ",")
}

// TestBodyRefusedWhileDecoding: a large check body is refused at the first
// descriptor (or entry) past the engine's bound, while the body is still
// arriving, and one declared over MaxBodyBytes before any of it is read;
// before, the whole body (up to 1 MiB) was read and decoded first, so
// these requests got no answer until the body ended.
func TestBodyRefusedWhileDecoding(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.apply(t)
	for _, tt := range []struct {
		name, path, head string
		length           int64
		status           int
		want             string
	}{
		{"descriptors, /v1/check", "/v1/check", `{"domain":"api","descriptors":[` + descriptors(3000, 1, "u"), -1, 400, "over 64 descriptors, at most 64 allowed"},
		{"descriptors, /json", "/json", `{"domain":"api","descriptors":[` + descriptors(3000, 1, "u"), -1, 400, "Bad Request"},
		{"entries", "/v1/check", `{"domain":"api","descriptors":[` + descriptors(1, 4000, "u"), -1, 400, "descriptors[0]: over 32 entries"},
		{"escaped member name", "/v1/check", `{"domain":"api","descr\u0069ptors":[` + descriptors(3000, 1, "u"), -1, 400, "over 64 descriptors"},
		{"declared over 1 MiB", "/v1/check", `{"domain":"api"`, checkserver.MaxBodyBytes + 1, 413, "too_large"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			status, body := sendOpen(t, f.url+tt.path, tt.head, tt.length)
			if status != tt.status || !strings.Contains(body, tt.want) {
				t.Errorf("%d %s, want %d and %q", status, body, tt.status, tt.want)
			}
		})
	}
	// A large body within the bounds is decoded as before.
	big := `{"domain":"api","descriptors":[` + descriptors(64, 1, strings.Repeat("v", 1500)) + `]}`
	if len(big) < 64<<10 {
		t.Fatalf("body is %d bytes, want one that is scanned", len(big))
	}
	if r := f.do(t, "POST", "/v1/check", big); r.status != http.StatusOK {
		t.Errorf("64 descriptors in %d bytes = %d %s, want 200", len(big), r.status, r.body)
	}
	if r := f.do(t, "POST", "/v1/check", big[:len(big)-1]+`,"bogus":1}`); r.status != http.StatusBadRequest ||
		!strings.Contains(r.body, "malformed RateLimitRequest") {
		t.Errorf("a large body with an unknown field = %d %s, want protojson's 400", r.status, r.body)
	}
}
