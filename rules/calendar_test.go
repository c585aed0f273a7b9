package rules

import (
	"testing"
	"time"
)

func TestUnitWindow(t *testing.T) {
	t.Parallel()
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		unit       Unit
		t          string
		start, end string
	}{
		{Day, "2026-11-30T23:59:59.999999Z", "2026-11-30T00:00:00Z", "2026-12-01T00:00:00Z"},
		{Day, "2026-12-01T00:00:00Z", "2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z"},
		{Week, "2026-12-01T10:00:00Z", "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z"}, // a Tuesday
		{Week, "2026-12-06T23:00:00Z", "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z"}, // a Sunday
		{Month, "2026-12-31T23:59:59Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{Month, "2028-02-29T12:00:00+05:00", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"},
		{Year, "2026-07-01T00:00:00Z", "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z"},
	}
	for _, tt := range tests {
		start, end := tt.unit.Window(at(tt.t))
		if !start.Equal(at(tt.start)) || !end.Equal(at(tt.end)) {
			t.Errorf("%s.Window(%s) = %s, %s; want %s, %s", tt.unit, tt.t, start, end, tt.start, tt.end)
		}
	}
	if s, e := Minute.Window(at(tests[0].t)); !s.IsZero() || !e.IsZero() {
		t.Errorf("Minute.Window = %s, %s; want zero times", s, e)
	}
}

func TestNearestWindowEnd(t *testing.T) {
	t.Parallel()
	end := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, skew := range []time.Duration{-11 * time.Hour, -time.Second, 0, time.Second, 11 * time.Hour} {
		for _, u := range []Unit{Day, Month} {
			if got := u.NearestWindowEnd(end.Add(skew)); !got.Equal(end) {
				t.Errorf("%s.NearestWindowEnd(end %+v) = %s, want %s", u, skew, got, end)
			}
		}
	}
}
