package api_test

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules/wire"
)

// seedQuotas stores one node batch of usage.
func (f *fixture) seedQuotas(t *testing.T, usage ...wire.QuotaUsage) {
	t.Helper()
	_, err := f.store.RecordQuota(context.Background(), "n1", &wire.Quota{Type: wire.TypeQuota, Epoch: "e", Seq: time.Now().UnixNano(), Usage: usage})
	if err != nil {
		t.Fatal(err)
	}
}

var (
	dec2026 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Unix()
	nov2026 = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).Unix()
)

func monthly(value string, start, hits int64) wire.QuotaUsage {
	return wire.QuotaUsage{Domain: "bill", Rule: "monthly", Unit: "month", Value: value, Start: start, Hits: hits, Limit: 1000}
}

func TestQuotasBadInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tests := []struct{ name, query, want string }{
		{"month 13", "period=2026-13", "the month must be 01 to 12"},
		{"no such day", "period=2026-02-30", "no such date"},
		{"no such week", "period=2026-W54", "2026 has no ISO week 54"},
		{"week 0", "period=2026-W00", "no ISO week 0"},
		{"two-digit year", "period=26-12", "four-digit year"},
		{"one-digit day", "period=2026-12-1", "unknown format"},
		{"before 1970", "period=1969", "1970 or later"},
		{"words", "period=last-month", "four-digit year"},
		{"value without domain", "value=alice", "value needs domain"},
		{"limit too big", "limit=5000", "at most 1000"},
		{"negative offset", "offset=-1", "non-negative"},
		{"format", "format=xml", "format must be csv"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := f.call(t, "GET", "/api/v1/quotas?"+tt.query, "viewer", "")
			if status != 400 || !strings.Contains(body, tt.want) || !strings.Contains(body, `"bad_request"`) {
				t.Errorf("GET ?%s = %d %s, want 400 with %q", tt.query, status, body, tt.want)
			}
		})
	}
}

type quotaAnswer struct {
	Usage []struct {
		Domain, Rule, Unit, Value string
		Masked                    bool
		PeriodStart               string `json:"period_start"`
		PeriodEnd                 string `json:"period_end"`
		Used, Limit               int64
	} `json:"usage"`
	NextOffset *int `json:"next_offset"`
}

func TestQuotasTopAndPeriods(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seedQuotas(t, monthly("a", dec2026, 5), monthly("b", dec2026, 50), monthly("c", dec2026, 7), monthly("a", nov2026, 900),
		wire.QuotaUsage{Domain: "bill", Rule: "daily", Unit: "day", Value: "a", Start: dec2026, Hits: 3, Limit: 10},
		wire.QuotaUsage{Domain: "bill", Rule: "weekly", Unit: "week", Value: "a", Start: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC).Unix(), Hits: 4, Limit: 10},
		wire.QuotaUsage{Domain: "bill", Rule: "yearly", Unit: "year", Value: "a", Start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), Hits: 6, Limit: 10})
	f.seedQuotas(t, monthly("a", dec2026, 2)) // another batch adds

	var got quotaAnswer
	f.decodeJSON(t, "GET", "/api/v1/quotas?domain=bill&rule=monthly&period=2026-12&limit=2", "viewer", "", 200, &got)
	if len(got.Usage) != 2 || got.Usage[0].Value != "b" || got.Usage[0].Used != 50 || got.Usage[1].Value != "a" || got.Usage[1].Used != 7 ||
		got.Usage[0].PeriodStart != "2026-12-01T00:00:00Z" || got.Usage[0].PeriodEnd != "2027-01-01T00:00:00Z" || got.Usage[0].Limit != 1000 ||
		got.NextOffset == nil || *got.NextOffset != 2 {
		t.Fatalf("top 2 of December: %+v next %v", got.Usage, got.NextOffset)
	}
	f.decodeJSON(t, "GET", "/api/v1/quotas?domain=bill&rule=monthly&period=2026-12&limit=2&offset=2", "viewer", "", 200, &got)
	if len(got.Usage) != 1 || got.Usage[0].Value != "c" || got.NextOffset != nil {
		t.Fatalf("page 2: %+v next %v", got.Usage, got.NextOffset)
	}
	for q, want := range map[string]string{
		"period=2026-12-01":                    "daily:2026-12-02T00:00:00Z:3",
		"period=2026-W49":                      "weekly:2026-12-07T00:00:00Z:4",
		"period=2026":                          "yearly:2027-01-01T00:00:00Z:6",
		"period=2026-11&domain=bill&value=a":   "monthly:2026-12-01T00:00:00Z:900",
		"period=2026-12&domain=bill&value=zzz": "",
	} {
		got = quotaAnswer{}
		f.decodeJSON(t, "GET", "/api/v1/quotas?"+q, "viewer", "", 200, &got)
		var rows []string
		for _, u := range got.Usage {
			rows = append(rows, u.Rule+":"+u.PeriodEnd+":"+itoa(u.Used))
		}
		if strings.Join(rows, ",") != want {
			t.Errorf("?%s: got %v, want %s", q, rows, want)
		}
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

func TestQuotasCSV(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seedQuotas(t, monthly("=HYPERLINK(\"x\")", dec2026, 3), monthly("a,b \"quoted\"", dec2026, 2), monthly("plain", dec2026, 1))
	resp := f.do(t, "GET", "/api/v1/quotas?period=2026-12&format=csv", "viewer", "", nil)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/csv; charset=utf-8" ||
		!strings.Contains(resp.Header.Get("Content-Disposition"), "sluice-quotas-2026-12.csv") {
		t.Fatalf("CSV answer %d %v", resp.StatusCode, resp.Header)
	}
	records, err := csv.NewReader(resp.Body).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"domain", "rule", "unit", "value", "period_start", "period_end", "used", "limit"},
		{"bill", "monthly", "month", "'=HYPERLINK(\"x\")", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", "3", "1000"},
		{"bill", "monthly", "month", "a,b \"quoted\"", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", "2", "1000"},
		{"bill", "monthly", "month", "plain", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", "1", "1000"},
	}
	if len(records) != len(want) {
		t.Fatalf("CSV rows: got %q, want %q", records, want)
	}
	for i := range want {
		if strings.Join(records[i], "|") != strings.Join(want[i], "|") {
			t.Errorf("CSV row %d: got %q, want %q", i, records[i], want[i])
		}
	}
	if status, body := f.call(t, "GET", "/api/v1/quotas?period=2026-12-32&format=csv", "viewer", ""); status != 400 || !strings.Contains(body, "no such date") {
		t.Errorf("bad period CSV = %d %s, want 400", status, body)
	}
}

// TestQuotasMaskedForViewers: a domain that masks its values shows viewers
// the masked form (in JSON and CSV) and refuses their value look-ups;
// editors see values.
func TestQuotasMaskedForViewers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if status, body := f.call(t, "PUT", "/api/v1/alerts", "admin", `{"domains":{"bill":{"mask_values":true}}}`); status != 200 {
		t.Fatalf("PUT alerts = %d %s", status, body)
	}
	f.seedQuotas(t, monthly("secret-key", dec2026, 3))
	var got quotaAnswer
	f.decodeJSON(t, "GET", "/api/v1/quotas?period=2026-12", "viewer", "", 200, &got)
	if len(got.Usage) != 1 || !got.Usage[0].Masked || !strings.HasPrefix(got.Usage[0].Value, "masked:") {
		t.Errorf("viewer sees %+v, want a masked value", got.Usage)
	}
	got = quotaAnswer{}
	f.decodeJSON(t, "GET", "/api/v1/quotas?period=2026-12&domain=bill&value=secret-key", "editor", "", 200, &got)
	if len(got.Usage) != 1 || got.Usage[0].Value != "secret-key" || got.Usage[0].Masked {
		t.Errorf("editor sees %+v, want the value", got.Usage)
	}
	if status, body := f.call(t, "GET", "/api/v1/quotas?period=2026-12&domain=bill&value=secret-key", "viewer", ""); status != 400 || !strings.Contains(body, "masks its values") {
		t.Errorf("viewer look-up = %d %s, want 400", status, body)
	}
	_, body := f.call(t, "GET", "/api/v1/quotas?period=2026-12&format=csv", "viewer", "")
	if strings.Contains(body, "secret-key") || !strings.Contains(body, "masked:") {
		t.Errorf("viewer CSV shows the value: %s", body)
	}
}
