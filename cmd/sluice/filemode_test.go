package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testenv"
)

// TestFileMode runs `sluice enforcer --rules-dir DIR` as a Lyft user would
// swap it in: no console, a directory of Lyft files. It checks decisions
// over HTTP /json (counted in fixed windows, as Lyft counts), an edit
// applied, a broken file refused with its position logged and the previous
// rules kept, the fix applied, and the reload metrics.
func TestFileMode(t *testing.T) {
	t.Parallel()
	redisURL := testenv.RedisURL(t)
	var rnd [6]byte
	rand.Read(rnd[:])
	domain := "filemode_" + hex.EncodeToString(rnd[:]) // counters of their own in the shared Redis
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	lyft := func(rpu int, unit string) string {
		return fmt.Sprintf("# A Lyft config, unchanged.\ndomain: %s\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: %s\n      requests_per_unit: %d\n", domain, unit, rpu)
	}
	putRules(t, file, lyft(3, "minute"))

	ctx, cancel := context.WithCancel(context.Background())
	logs := &lockedBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"enforcer", "--rules-dir", dir, "--redis-url", redisURL,
			"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--state-dir", t.TempDir(),
			"--redis-timeout", "2s"}, // a loaded machine must not fail open
			func(string) string { return "" }, io.Discard, logs)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("enforcer: %v", err)
		}
	})
	base := "http://" + waitLog(t, logs, regexp.MustCompile(`http_addr=(\S+)`))
	if status, _ := httpGet(t, base+"/readyz"); status != http.StatusOK {
		t.Fatalf("/readyz %d, want 200 with the files loaded", status)
	}

	type status struct {
		Code         string `json:"code"`
		CurrentLimit struct {
			Name            string `json:"name"`
			RequestsPerUnit int    `json:"requestsPerUnit"`
		} `json:"currentLimit"`
		LimitRemaining     int    `json:"limitRemaining"`
		DurationUntilReset string `json:"durationUntilReset"`
	}
	check := func(user string) (int, status) {
		t.Helper()
		body := fmt.Sprintf(`{"domain":%q,"descriptors":[{"entries":[{"key":"user","value":%q}]}]}`, domain, user)
		resp, err := http.Post(base+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct{ Statuses []status }
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Statuses) != 1 {
			t.Fatalf("/json: %v %+v", err, out)
		}
		return resp.StatusCode, out.Statuses[0]
	}

	// Lyft's counting: a fixed minute window. What remains goes down by
	// one a request, the reset stays the window's end, the fourth is over.
	var resets []time.Duration
	for i := range 3 {
		code, s := check("alice")
		if code != http.StatusOK || s.LimitRemaining != 2-i || s.CurrentLimit.RequestsPerUnit != 3 || s.CurrentLimit.Name != "" {
			t.Fatalf("request %d: %d %+v, want 200, %d remaining of 3, no name", i+1, code, s, 2-i)
		}
		d, err := time.ParseDuration(s.DurationUntilReset)
		if err != nil || d <= 0 || d > time.Minute {
			t.Fatalf("request %d: duration_until_reset %q, want within the minute window", i+1, s.DurationUntilReset)
		}
		resets = append(resets, d)
	}
	if resets[2] > resets[0] {
		t.Errorf("duration_until_reset grew with use (%v then %v): not a fixed window", resets[0], resets[2])
	}
	if code, s := check("alice"); code != http.StatusTooManyRequests || s.Code != "OVER_LIMIT" {
		t.Fatalf("request 4: %d %+v, want 429", code, s)
	}

	// An edit is applied within the poll interval.
	putRules(t, file, lyft(10, "minute"))
	waitLimit := func(rpu int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, s := check("bob")
			if s.CurrentLimit.RequestsPerUnit == rpu {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("limit %d not applied in 10s; last answer %+v\n%s", rpu, s, logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitLimit(10)
	if code, s := check("alice"); code != http.StatusOK || s.LimitRemaining != 6 {
		t.Errorf("alice after the edit: %d %+v, want 200 with 6 of 10 left (3 counted, the rejected one not)", code, s)
	}

	// A broken file: refused, its position logged, the previous rules kept.
	putRules(t, file, lyft(20, "fortnight"))
	waitLog(t, logs, regexp.MustCompile(regexp.QuoteMeta(file)+`:6:13: descriptors\[0\]\.rate_limit\.unit: \\"…\\" is not a unit`))
	if _, s := check("carol"); s.CurrentLimit.RequestsPerUnit != 10 {
		t.Errorf("after the broken file: limit %d, want the previous 10", s.CurrentLimit.RequestsPerUnit)
	}
	if status, _ := httpGet(t, base+"/readyz"); status != http.StatusOK {
		t.Errorf("/readyz %d after a broken file, want 200 (the previous rules serve)", status)
	}

	// Fixed: applied.
	putRules(t, file, lyft(20, "minute"))
	waitLimit(20)
	_, metrics := httpGet(t, base+"/metrics")
	for _, want := range []string{`sluice_enforcer_rules_reloads_total{result="applied"} 3`, `sluice_enforcer_rules_reloads_total{result="failed"} 1`, "sluice_enforcer_rules_last_reload_successful 1"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestFileModeFlags: --rules-dir excludes a console, by flag or by env.
func TestFileModeFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tt := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"enforcer", "--rules-dir", dir, "--console-url", "http://127.0.0.1:8080"}, nil},
		{[]string{"enforcer", "--console-url", "http://c:8080"}, map[string]string{"SLUICE_RULES_DIR": dir}},
		{[]string{"enforcer", "--rules-dir", dir}, map[string]string{"SLUICE_CONSOLE_URL": "http://c:8080"}},
	} {
		err := run(context.Background(), tt.args, func(k string) string { return tt.env[k] }, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--rules-dir (SLUICE_RULES_DIR) and --console-url (SLUICE_CONSOLE_URL) are mutually exclusive") {
			t.Errorf("%v %v: %v, want mutually exclusive", tt.args, tt.env, err)
		}
	}
}

func putRules(t *testing.T, path, src string) {
	t.Helper()
	// Write and rename, as editors and config management do, so the poll
	// never reads half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// waitLog waits for logs to match re and returns its first group.
func waitLog(t *testing.T, logs *lockedBuffer, re *regexp.Regexp) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if m := re.FindStringSubmatch(logs.String()); m != nil {
			if len(m) > 1 {
				return m[1]
			}
			return m[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line matches %s:\n%s", re, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
