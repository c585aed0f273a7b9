package subscriber

import (
	"cmp"
	"encoding/json"
	"slices"

	"github.com/sluicehq/sluice/rules/wire"
)

// encodeStats encodes st within the protocol's limits, which the console
// enforces by closing the connection: at most wire.MaxStatsRules rules and
// wire.MaxTopValues top values and wire.MaxValues values each, and
// wire.MaxNodeMessageBytes in all. When the message is too big, each rule
// names fewer of its values (halving, the least limited go first), then
// top values go, then the impact
// preview's spans (at most wire.MaxStatsRules; a preview lost so shows as a
// gap in that span's replay), then the least busy rules.
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
	if len(st.Preview) > wire.MaxStatsRules {
		st.Preview = st.Preview[:wire.MaxStatsRules]
	}
	for i := range rules {
		if len(rules[i].Values) > wire.MaxValues {
			rules[i].Values = rules[i].Values[:wire.MaxValues]
		}
	}
	data, err := json.Marshal(st)
	if err != nil || len(data) <= wire.MaxNodeMessageBytes {
		return data, err
	}
	// Too big: first name fewer values per rule (the most limited are
	// kept: Values comes most first), which only makes the console's
	// per-value figures lower bounds.
	for keep := wire.MaxValues / 2; ; keep /= 2 {
		for i := range st.Rules {
			if len(st.Rules[i].Values) > keep {
				st.Rules[i].Values = st.Rules[i].Values[:keep]
			}
		}
		if data, err = json.Marshal(st); err != nil || len(data) <= wire.MaxNodeMessageBytes {
			return data, err
		}
		if keep == 0 {
			break
		}
	}
	for i := range st.Rules {
		st.Rules[i].TopLimited = nil
	}
	if data, err = json.Marshal(st); err != nil || len(data) <= wire.MaxNodeMessageBytes {
		return data, err
	}
	st.Preview = nil
	slices.SortStableFunc(st.Rules, func(a, b wire.RuleStats) int { return cmp.Compare(busy(b), busy(a)) })
	for {
		data, err = json.Marshal(st)
		if err != nil || len(data) <= wire.MaxNodeMessageBytes {
			return data, err
		}
		st.Rules = st.Rules[:len(st.Rules)/2]
	}
}
