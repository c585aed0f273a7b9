package subscriber

import (
	"cmp"
	"encoding/json"
	"slices"
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/rules/wire"
)

// MetricStats returns a StatsSource that reads a per-rule decision counter
// from g: family is a counter with labels domain, rule and result (allowed,
// limited, shadow_limited or store_error), such as the check servers'
// sluice_enforcer_rule_decisions_total. Each call reports what the counter
// gained since the previous call. It cannot report top limited values; a
// source inside the engine can.
func MetricStats(g prometheus.Gatherer, family string) StatsSource {
	var (
		mu   sync.Mutex
		last = map[[3]string]float64{}
	)
	return func() []wire.RuleStats {
		mu.Lock()
		defer mu.Unlock()
		families, err := g.Gather()
		if err != nil && len(families) == 0 {
			return nil // nothing this time; the next call reports the gain
		}
		byRule := map[[2]string]*wire.RuleStats{}
		for _, f := range families {
			if f.GetName() != family {
				continue
			}
			for _, m := range f.GetMetric() {
				if m.GetCounter() == nil {
					continue
				}
				var key [3]string
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "domain":
						key[0] = l.GetValue()
					case "rule":
						key[1] = l.GetValue()
					case "result":
						key[2] = l.GetValue()
					}
				}
				v := m.GetCounter().GetValue()
				gain := int64(v - last[key])
				last[key] = v
				if gain <= 0 {
					continue
				}
				rs := byRule[[2]string{key[0], key[1]}]
				if rs == nil {
					rs = &wire.RuleStats{Domain: key[0], Rule: key[1]}
					byRule[[2]string{key[0], key[1]}] = rs
				}
				switch key[2] {
				case "allowed":
					rs.Allowed += gain
				case "limited":
					rs.Limited += gain
				case "shadow_limited":
					rs.ShadowLimited += gain
				case "store_error":
					rs.StoreErrors += gain
				}
			}
		}
		out := make([]wire.RuleStats, 0, len(byRule))
		for _, rs := range byRule {
			out = append(out, *rs)
		}
		sort.Slice(out, func(i, j int) bool {
			if out[i].Domain != out[j].Domain {
				return out[i].Domain < out[j].Domain
			}
			return out[i].Rule < out[j].Rule
		})
		if len(out) > wire.MaxStatsRules {
			out = out[:wire.MaxStatsRules]
		}
		return out
	}
}

// encodeStats encodes st within the protocol's limits, which the console
// enforces by closing the connection: at most wire.MaxStatsRules rules and
// wire.MaxTopValues top values each, and wire.MaxNodeMessageBytes in all.
// When the message is too big, top values go first, then the least busy
// rules.
func encodeStats(st wire.Stats) ([]byte, error) {
	rules := slices.Clone(st.Rules)
	for i := range rules {
		if len(rules[i].TopLimited) > wire.MaxTopValues {
			rules[i].TopLimited = rules[i].TopLimited[:wire.MaxTopValues]
		}
	}
	busy := func(r wire.RuleStats) int64 { return r.Allowed + r.Limited + r.ShadowLimited + r.StoreErrors }
	if len(rules) > wire.MaxStatsRules {
		slices.SortStableFunc(rules, func(a, b wire.RuleStats) int { return cmp.Compare(busy(b), busy(a)) })
		rules = rules[:wire.MaxStatsRules]
	}
	st.Rules = rules
	data, err := json.Marshal(st)
	if err != nil || len(data) <= wire.MaxNodeMessageBytes {
		return data, err
	}
	for i := range st.Rules {
		st.Rules[i].TopLimited = nil
	}
	slices.SortStableFunc(st.Rules, func(a, b wire.RuleStats) int { return cmp.Compare(busy(b), busy(a)) })
	for {
		data, err = json.Marshal(st)
		if err != nil || len(data) <= wire.MaxNodeMessageBytes {
			return data, err
		}
		st.Rules = st.Rules[:len(st.Rules)/2]
	}
}
