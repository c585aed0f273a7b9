package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/sluicehq/sluice/backend/store"
)

// manyLimits is a domain with n limits (one value each).
func manyLimits(name string, n int) string {
	var b strings.Builder
	b.WriteString("domain: " + name + "\ndescriptors:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - key: k\n    value: v%d\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", i, i+1)
	}
	return b.String()
}

// TestListDomainsParsesOncePerRevision: GET /api/v1/domains parses a
// domain's YAML once per revision, not on every request; a publish makes
// the next listing parse only the domain it changed, and the answer is
// the new version's.
func TestListDomainsParsesOncePerRevision(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	for i, name := range []string{"a", "b", "c"} {
		if _, err := f.store.Publish(ctx, store.Change{Domain: name, YAML: manyLimits(name, i+1), Message: "m", BaseVersion: int64(i), Actor: sys}); err != nil {
			t.Fatal(err)
		}
	}
	var list struct {
		Version int64
		Domains []struct {
			Name    string
			Version int64
			Limits  int
		}
	}
	f.decodeJSON(t, "GET", "/api/v1/domains", "viewer", "", 200, &list)
	if list.Version != 3 || len(list.Domains) != 3 || list.Domains[2].Limits != 3 {
		t.Fatalf("GET /domains = %+v, want version 3 and 3 domains, c with 3 limits", list)
	}
	if got := f.api.DomainParses(); got != 3 {
		t.Fatalf("first listing parsed %d domains, want 3", got)
	}
	for range 5 {
		f.decodeJSON(t, "GET", "/api/v1/domains", "viewer", "", 200, &list)
	}
	if got := f.api.DomainParses(); got != 3 {
		t.Errorf("after 5 more listings: %d domains parsed, want still 3", got)
	}
	body := fmt.Sprintf(`{"yaml":%s,"message":"m","base_version":3}`, jsonString(manyLimits("b", 7)))
	f.decodeJSON(t, "PUT", "/api/v1/domains/b", "editor", body, 200, nil)
	f.decodeJSON(t, "GET", "/api/v1/domains", "viewer", "", 200, &list)
	if list.Version != 4 || list.Domains[1].Name != "b" || list.Domains[1].Limits != 7 || list.Domains[1].Version != 4 {
		t.Errorf("after publishing b: %+v, want version 4 and b with 7 limits at version 4", list)
	}
	if got := f.api.DomainParses(); got != 4 {
		t.Errorf("after a publish of one domain: %d domains parsed in all, want 4", got)
	}
}

// TestPreviewBounded: a draft over the preview's size bound gets 413 and
// one that changes more limits than a preview replays gets 422, each
// saying the bound; a draft at the limit count is previewed.
func TestPreviewBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	preview := func(yaml string) (int, string) {
		return f.call(t, "POST", "/api/v1/preview", "editor", fmt.Sprintf(`{"domain":"big","yaml":%s}`, jsonString(yaml)))
	}
	huge := manyLimits("big", 1) + "# " + strings.Repeat("x", 300<<10) + "\n"
	if status, body := preview(huge); status != http.StatusRequestEntityTooLarge ||
		!strings.Contains(body, "a preview takes at most 262144 bytes of YAML") {
		t.Errorf("a 300 KiB preview = %d %s, want 413 naming the bound", status, excerpt(body))
	}
	if status, body := preview(manyLimits("big", 201)); status != http.StatusUnprocessableEntity ||
		!strings.Contains(body, `"code":"too_many_limits"`) || !strings.Contains(body, `"max_limits":200`) {
		t.Errorf("a preview of 201 new limits = %d %s, want 422 too_many_limits", status, excerpt(body))
	}
	if status, body := preview(manyLimits("big", 200)); status != http.StatusOK {
		t.Errorf("a preview of 200 new limits = %d %s, want 200", status, excerpt(body))
	}
}

// TestSignInFloodGets503: password checks run at most SetPasswordChecks at
// once with a bounded queue behind them; a sign-in past that is answered
// at once with 503 and Retry-After (and is not counted as a failure),
// instead of every check queueing for a CPU and slowing every other
// request.
func TestSignInFloodGets503(t *testing.T) {
	t.Parallel()
	f := newFixtureCost(t, bcrypt.DefaultCost) // checks slow enough for the flood to queue
	f.store.SetPasswordChecks(1)               // 1 running, 8 waiting
	const n = 15
	type answer struct {
		status int
		retry  string
	}
	answers := make(chan answer, n)
	for i := range n {
		go func() {
			resp := f.do(t, "POST", "/api/v1/auth/login", "", fmt.Sprintf(`{"username":"nobody%d","password":"x"}`, i), nil)
			resp.Body.Close()
			answers <- answer{resp.StatusCode, resp.Header.Get("Retry-After")}
		}()
	}
	counts := map[int]int{}
	for range n {
		a := <-answers
		counts[a.status]++
		if a.status == http.StatusServiceUnavailable && a.retry != "1" {
			t.Errorf("503 with Retry-After %q, want 1", a.retry)
		}
	}
	if counts[http.StatusServiceUnavailable] == 0 || counts[http.StatusUnauthorized] == 0 ||
		counts[http.StatusServiceUnavailable]+counts[http.StatusUnauthorized] != n {
		t.Errorf("%d concurrent sign-ins with 1 check at a time: %v, want some 401 and the rest 503", n, counts)
	}
	_, metrics := f.call(t, "GET", "/metrics", "", "")
	if want := fmt.Sprintf(`sluice_console_login_failures_total{outcome="busy"} %d`, counts[http.StatusServiceUnavailable]); !strings.Contains(metrics, want) {
		t.Errorf("metrics lack %s", want)
	}
	if status, body := f.call(t, "POST", "/api/v1/auth/login", "", `{"username":"alice","password":"correct horse"}`); status != http.StatusOK {
		t.Errorf("after the flood, alice's sign-in = %d %s, want 200", status, excerpt(body))
	}
}
