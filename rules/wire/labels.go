package wire

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// Label syntax, for the labels an operator gives an enforcer (--labels) and
// the label selectors of staged rollouts: a key is 1-63 of letters, digits
// and "_.-/" starting with a letter or digit; a value is 1-63 of letters,
// digits and "_.-". Hello accepts any text within MaxLabelBytes (older
// nodes), but only labels of this syntax can be selected.
const MaxLabelChars = 63

var (
	labelKey   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_./-]{0,62}$`)
	labelValue = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,63}$`)
)

// CheckLabels returns an error naming the first bad label of m (in key
// order) and what a good one looks like, or nil.
func CheckLabels(m map[string]string) error {
	if len(m) > MaxLabels {
		return fmt.Errorf("labels: %d labels, at most %d", len(m), MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !labelKey.MatchString(k) {
			return fmt.Errorf("label key %q: use 1-%d letters, digits, '_', '.', '-', '/', starting with a letter or digit", abbrev(CleanText(k), 40), MaxLabelChars)
		}
		if !labelValue.MatchString(m[k]) {
			return fmt.Errorf("label %s=%q: values are 1-%d letters, digits, '_', '.', '-'", k, abbrev(CleanText(m[k]), 40), MaxLabelChars)
		}
	}
	return nil
}

// ParseLabels parses "k=v,k=v" (spaces around items, keys and values are
// ignored; empty input is no labels) and checks it with CheckLabels. A key
// given twice is an error.
func ParseLabels(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			return nil, fmt.Errorf("labels: %q is not key=value", abbrev(CleanText(strings.TrimSpace(kv)), 40))
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("labels: key %q is given twice", abbrev(CleanText(k), 40))
		}
		out[k] = v
	}
	if err := CheckLabels(out); err != nil {
		return nil, err
	}
	return out, nil
}

// MatchLabels reports whether labels has every key of selector with the
// same value. An empty selector matches nothing: a rollout always names the
// nodes it goes to.
func MatchLabels(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
