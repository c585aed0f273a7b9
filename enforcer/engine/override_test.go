package engine

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// TestOverridePeriodBounded: an override's period is
// its unit times its multiplier, computed without overflow and refused
// over MaxOverridePeriod (one year).
func TestOverridePeriodBounded(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	for _, tt := range []struct {
		unit       rules.Unit
		multiplier uint32
		want       time.Duration // 0: refused
	}{
		{rules.Second, 0, time.Second},
		{rules.Second, 1, time.Second},
		{rules.Minute, 525600, 365 * day},
		{rules.Day, 365, 365 * day},
		{rules.Day, 366, 0},
		{rules.Year, 1, 365 * day},
		{rules.Year, 2, 0},
		{rules.Year, math.MaxUint32, 0},
		{rules.Second, math.MaxUint32, 0},
		{rules.Month, math.MaxUint32, 0},
	} {
		l, err := overrideLimit("api", &Override{RequestsPerUnit: 10, Unit: tt.unit, Multiplier: tt.multiplier}, nil, "")
		switch {
		case tt.want == 0 && (err == nil || !strings.Contains(err.Error(), "longest period allowed")):
			t.Errorf("%d × %s: %v, %v; want refused", tt.multiplier, tt.unit, l, err)
		case tt.want != 0 && err != nil:
			t.Errorf("%d × %s: %v, want period %s", tt.multiplier, tt.unit, err, tt.want)
		case tt.want != 0 && l.Period != tt.want:
			t.Errorf("%d × %s: period %s, want %s", tt.multiplier, tt.unit, l.Period, tt.want)
		}
	}
}
