package main

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rules"
)

// TestDemoDomain checks the limits the README and the demo traffic count
// on: 5 a minute for k1, 10 a second for the demo keys and addresses, and
// a shadow-mode limit on /search.
func TestDemoDomain(t *testing.T) {
	t.Parallel()
	d, err := rules.Parse("demo.yaml", []byte(demoDomain))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		t.Fatal(err)
	}
	demo := demoConfig{}.withDefaults()
	tests := []struct {
		key, value string
		name       string
		unit       rules.Unit
		n          uint32
		shadow     bool
	}{
		{"api_key", "k1", "per-key", rules.Minute, 5, false},
		{"api_key", demo.Keys[0], "per-demo-key", rules.Second, 10, false},
		{"api_key", demo.HotKey, "per-demo-key", rules.Second, 10, false},
		{"remote_address", demo.Addrs[0], "per-address", rules.Second, 10, false},
		{"route", "/search", "search-shadow", rules.Second, 5, true},
		{"customer", demo.Keys[0], "monthly-quota", rules.Month, 1000000, false},
	}
	for _, tt := range tests {
		l := set.Match("demo", []rules.Entry{{Key: tt.key, Value: tt.value}})
		if l == nil {
			t.Errorf("%s=%s: no limit, want %s", tt.key, tt.value, tt.name)
			continue
		}
		if l.Name != tt.name || l.Unit != tt.unit || l.RequestsPerUnit != tt.n || l.ShadowMode != tt.shadow {
			t.Errorf("%s=%s: limit %s %d/%s shadow %t, want %s %d/%s shadow %t", tt.key, tt.value,
				l.Name, l.RequestsPerUnit, l.Unit, l.ShadowMode, tt.name, tt.n, tt.unit, tt.shadow)
		}
	}
	if l := set.Match("demo", []rules.Entry{{Key: "route", Value: "/orders"}}); l != nil {
		t.Errorf("route=/orders: limit %s, want none", l.Name)
	}
}

func TestDevFlagsDemoTraffic(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  string // SLUICE_DEMO_TRAFFIC
		want bool
	}{
		{"on by default", nil, "", true},
		{"flag off", []string{"--demo-traffic=false"}, "", false},
		{"env off", nil, "false", false},
		{"env 0", nil, "0", false},
		{"flag beats env", []string{"--demo-traffic"}, "off", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string {
				if k == "SLUICE_DEMO_TRAFFIC" {
					return tt.env
				}
				return ""
			}
			cfg, err := parseDevFlags(tt.args, getenv, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.demoTraffic != tt.want {
				t.Errorf("demo traffic = %t, want %t", cfg.demoTraffic, tt.want)
			}
		})
	}
}

func TestDevBanner(t *testing.T) {
	t.Parallel()
	demo := demoConfig{}.withDefaults()
	var on, off bytes.Buffer
	devBanner(&on, "http://localhost:8080", "pw", "localhost:8081", "localhost:8082", &demo)
	devBanner(&off, "http://localhost:8080", "pw", "localhost:8081", "localhost:8082", nil)
	if want := "Demo traffic: on, 10 checks/s and a burst on demo-hot-key every 45s; --demo-traffic=false turns it off\n"; !strings.Contains(on.String(), want) {
		t.Errorf("banner with demo traffic:\n%s\nwant a line %q", on.String(), want)
	}
	if strings.Contains(off.String(), "Demo traffic") {
		t.Errorf("banner without demo traffic mentions it:\n%s", off.String())
	}
	for _, b := range []string{on.String(), off.String()} {
		if !strings.Contains(b, "Sluice is running.") || !strings.HasSuffix(b, "Press Ctrl-C to stop.\n") {
			t.Errorf("banner:\n%s", b)
		}
	}
}
