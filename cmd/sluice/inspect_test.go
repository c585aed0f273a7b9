package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/consoletest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

const ctlSupportYAML = `domain: shop
descriptors:
  - key: customer
    rate_limit: {unit: hour, requests_per_unit: 100, name: per-customer}
    descriptors:
      - key: route
        value: /search
        algorithm: sliding_window_log
        rate_limit: {unit: minute, requests_per_unit: 10, name: search}
`

// TestCtlInspectReset: sluice ctl inspect shows what an enforcer counted
// (a request of two descriptors, "+" between them), reset -m starts one
// customer afresh and leaves the other alone.
func TestCtlInspectReset(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	prefix := testenv.KeyPrefix(t)
	base := consoletest.Start(t, ctx, &wg, backend.Config{DatabaseURL: testenv.PostgresURL(t), AdminPassword: "ctl-password",
		RedisURL: testenv.RedisURL(t), KeyPrefix: prefix}, nil)
	admin := login(t, base, "admin", "ctl-password")
	var tok struct {
		Token string `json:"token"`
	}
	admin.MustDo(t, "POST", "/api/v1/tokens", map[string]string{"name": "desk", "role": "support"}, 201, &tok)
	c := &ctlConsole{base: base, admin: admin, token: tok.Token,
		env: map[string]string{"SLUICE_CONSOLE_URL": base, "SLUICE_TOKEN": tok.Token, "HOME": t.TempDir()}}
	v := c.publish(t, "shop", ctlSupportYAML, 0)

	// An enforcer's engine counting in the same Redis, under the same prefix.
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	d, err := rules.Parse("shop.yaml", []byte(ctlSupportYAML))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		t.Fatal(err)
	}
	node := engine.New(limiter.NewRedis(client), prefix, engine.WithoutStats())
	if err := node.Apply(v, set); err != nil {
		t.Fatal(err)
	}
	request := func(customer string) engine.Request {
		return engine.Request{Domain: "shop", Descriptors: []engine.Descriptor{
			{Entries: []rules.Entry{{Key: "customer", Value: customer}}},
			{Entries: []rules.Entry{{Key: "customer", Value: customer}, {Key: "route", Value: "/search"}}},
		}}
	}
	for _, customer := range []string{"c1", "c2"} {
		for range 3 {
			if res, err := node.Check(ctx, request(customer)); err != nil || res.Code != engine.OK || res.StoreErr != nil {
				t.Fatalf("check: %+v, %v", res, err)
			}
		}
	}
	t.Cleanup(func() {
		for _, customer := range []string{"c1", "c2"} {
			if ins, err := node.Limits(request(customer)); err == nil {
				_, _ = node.Reset(context.Background(), ins)
			}
		}
	})

	used := func(customer string) map[string]int64 {
		t.Helper()
		out, _ := c.mustCtl(t, 0, "inspect", "shop", "customer="+customer, "+", "customer="+customer, "route=/search", "-o", "json")
		var ins struct {
			Version int64 `json:"version"`
			Limits  []struct {
				Descriptor int    `json:"descriptor"`
				Rule       string `json:"rule"`
				Used       int64  `json:"used"`
			} `json:"limits"`
		}
		if err := json.Unmarshal([]byte(out), &ins); err != nil {
			t.Fatalf("inspect -o json: %v\n%s", err, out)
		}
		got := map[string]int64{}
		for _, l := range ins.Limits {
			got[l.Rule] = l.Used
		}
		return got
	}
	if got := used("c1"); got["per-customer"] != 3 || got["search"] != 3 {
		t.Errorf("inspect c1 = %v, want 3 used of each", got)
	}
	out, _ := c.mustCtl(t, 0, "inspect", "shop", "customer=c1", "+", "customer=c1", "route=/search")
	for _, want := range []string{"RULE", "per-customer", "search", "sliding_window_log", "3/10", "100/hour"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect table lacks %q:\n%s", want, out)
		}
	}

	if _, stderr := c.mustCtl(t, 1, "reset", "shop", "customer=c1"); !strings.Contains(stderr, "-m MSG is required") {
		t.Errorf("reset without -m: %s", stderr)
	}
	if _, stderr := c.mustCtl(t, 1, "inspect", "shop", "customer"); !strings.Contains(stderr, "want key=value") {
		t.Errorf("inspect of a bare word: %s", stderr)
	}
	if _, stderr := c.mustCtl(t, 1, "inspect", "shop", "a=b", "+"); !strings.Contains(stderr, "at least one key=value") {
		t.Errorf("inspect ending in +: %s", stderr)
	}
	if _, stderr := c.mustCtl(t, 1, "inspect", "nope", "a=b"); !strings.Contains(stderr, "404") {
		t.Errorf("inspect of an unknown domain: %s", stderr)
	}
	out, _ = c.mustCtl(t, 0, "reset", "shop", "customer=c1", "+", "customer=c1", "route=/search", "-m", "ticket 42")
	if !strings.Contains(out, "reset 2 limits") {
		t.Errorf("reset: %s", out)
	}
	if got := used("c1"); got["per-customer"] != 0 || got["search"] != 0 {
		t.Errorf("inspect c1 after its reset = %v, want 0 used", got)
	}
	if got := used("c2"); got["per-customer"] != 3 || got["search"] != 3 {
		t.Errorf("inspect c2 after c1's reset = %v, want its 3 used untouched", got)
	}
}

// TestConsoleRedisURL: the console takes --redis-url / REDIS_URL (empty
// by default), prints it redacted, and refuses a URL it cannot use.
func TestConsoleRedisURL(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	env := map[string]string{"REDIS_URL": "redis+cluster://:pw@h1:7000,h2:7001"}
	if err := run(context.Background(), []string{"console", "--print-config"}, func(k string) string { return env[k] }, &out, &errOut); err != nil {
		t.Fatalf("print-config: %v\n%s", err, errOut.String())
	}
	if got := out.String(); !strings.Contains(got, "redis_url=redis+cluster://") || strings.Contains(got, "pw@") {
		t.Errorf("print-config with REDIS_URL:\n%s", got)
	}
	out.Reset()
	if err := run(context.Background(), []string{"console", "--print-config"}, func(string) string { return "" }, &out, &errOut); err != nil || !strings.Contains(out.String(), "redis_url=\n") {
		t.Errorf("print-config without REDIS_URL: %v\n%s", err, out.String())
	}
	err := run(context.Background(), []string{"console", "--redis-url", "redis+sentinel://s1:1"}, func(string) string { return "" }, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "counter store") {
		t.Errorf("a bad --redis-url: %v, want an error about the counter store", err)
	}
}
