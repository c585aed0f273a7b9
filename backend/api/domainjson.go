package api

import (
	"cmp"

	"github.com/sluicehq/sluice/rules"
)

// The JSON forms of a parsed domain are defined here, in the API, so the
// rules package stays free of presentation concerns. Field names follow the
// YAML format, so the structured form reads like the file.

// domainJSON is a domain's configuration as written (defaults not filled in).
type domainJSON struct {
	Domain      string           `json:"domain"`
	Descriptors []descriptorJSON `json:"descriptors"`
}

type descriptorJSON struct {
	Key            string           `json:"key"`
	Value          string           `json:"value,omitempty"`
	RateLimit      *rateLimitJSON   `json:"rate_limit,omitempty"`
	Algorithm      string           `json:"algorithm,omitempty"`
	Burst          uint32           `json:"burst,omitempty"`
	ShadowMode     bool             `json:"shadow_mode,omitempty"`
	DetailedMetric bool             `json:"detailed_metric,omitempty"`
	FailureMode    string           `json:"failure_mode,omitempty"`
	Descriptors    []descriptorJSON `json:"descriptors,omitempty"`
}

type rateLimitJSON struct {
	Unit            string   `json:"unit,omitempty"`
	RequestsPerUnit uint32   `json:"requests_per_unit,omitempty"`
	Unlimited       bool     `json:"unlimited,omitempty"`
	Name            string   `json:"name,omitempty"`
	Replaces        []string `json:"replaces,omitempty"`
}

func domainConfig(d *rules.Domain) domainJSON {
	return domainJSON{Domain: d.Name, Descriptors: descriptorsJSON(d.Descriptors)}
}

func descriptorsJSON(ds []rules.Descriptor) []descriptorJSON {
	out := make([]descriptorJSON, len(ds))
	for i, d := range ds {
		out[i] = descriptorJSON{Key: d.Key, Value: d.Value, Algorithm: string(d.Algorithm), Burst: d.Burst,
			ShadowMode: d.ShadowMode, DetailedMetric: d.DetailedMetric, FailureMode: string(d.FailureMode)}
		if rl := d.RateLimit; rl != nil {
			out[i].RateLimit = &rateLimitJSON{Unit: string(rl.Unit), RequestsPerUnit: rl.RequestsPerUnit,
				Unlimited: rl.Unlimited, Name: rl.Name, Replaces: rl.Replaces}
		}
		if len(d.Descriptors) > 0 {
			out[i].Descriptors = descriptorsJSON(d.Descriptors)
		}
	}
	return out
}

// limitJSON is one effective limit of a domain, with every default filled
// in, as the enforcer applies it.
type limitJSON struct {
	// Path is the descriptor's place in the tree, Lyft style: key or
	// key_value per level, joined by ".". It identifies the limit in diffs.
	Path            string   `json:"path"`
	Name            string   `json:"name"` // rate_limit.name, else Path
	Unit            string   `json:"unit,omitempty"`
	RequestsPerUnit uint32   `json:"requests_per_unit"`
	Burst           uint32   `json:"burst"`
	Algorithm       string   `json:"algorithm"`
	Unlimited       bool     `json:"unlimited"`
	ShadowMode      bool     `json:"shadow_mode"`
	DetailedMetric  bool     `json:"detailed_metric"`
	FailureMode     string   `json:"failure_mode"`
	Replaces        []string `json:"replaces,omitempty"`
}

// limitsOf lists a domain's limits in tree order.
func limitsOf(d *rules.Domain) []limitJSON {
	ls := pathLimits(d)
	out := make([]limitJSON, len(ls))
	for i, l := range ls {
		out[i] = l.limit
	}
	return out
}

// limitOf is desc's limit, at path, with the defaults the enforcer applies.
func limitOf(desc rules.Descriptor, path string) limitJSON {
	rl := desc.RateLimit
	l := limitJSON{Path: path, Name: cmp.Or(rl.Name, path), RequestsPerUnit: rl.RequestsPerUnit,
		Burst: cmp.Or(desc.Burst, rl.RequestsPerUnit), Algorithm: string(cmp.Or(desc.Algorithm, rules.TokenBucket)),
		Unlimited: rl.Unlimited, ShadowMode: desc.ShadowMode, DetailedMetric: desc.DetailedMetric,
		FailureMode: string(cmp.Or(desc.FailureMode, rules.FailOpen)), Replaces: rl.Replaces}
	if !rl.Unlimited {
		l.Unit = string(rl.Unit)
	}
	return l
}
