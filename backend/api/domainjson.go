package api

import (
	"cmp"
	"strings"

	"github.com/sluicehq/sluice/rules"
)

// The JSON forms of a parsed domain are defined here, in the API, so the
// rules package stays free of presentation concerns. Field names follow the
// YAML format, so the structured form reads like the file.

// domainJSON is a domain's configuration as written (defaults not filled in).
type domainJSON struct {
	Domain             string                  `json:"domain"`
	DefaultAlgorithm   string                  `json:"default_algorithm,omitempty"`
	RequestDescriptors []requestDescriptorJSON `json:"request_descriptors,omitempty"`
	Descriptors        []descriptorJSON        `json:"descriptors"`
}

type requestDescriptorJSON struct {
	Entries []requestEntryJSON `json:"entries"`
}

type requestEntryJSON struct {
	Key   string `json:"key"`
	From  string `json:"from,omitempty"`
	Name  string `json:"name,omitempty"`
	Value string `json:"value,omitempty"`
}

type onLimitJSON struct {
	Action   string `json:"action,omitempty"`
	MaxDelay string `json:"max_delay,omitempty"`
	Status   int    `json:"status,omitempty"`
}

func onLimit(o *rules.OnLimit) *onLimitJSON {
	if o == nil {
		return nil
	}
	out := &onLimitJSON{Action: string(o.Action), Status: o.Status}
	if o.MaxDelay > 0 {
		out.MaxDelay = o.MaxDelay.String()
	}
	return out
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
	ValueToMetric  bool             `json:"value_to_metric,omitempty"`
	ShareThreshold bool             `json:"share_threshold,omitempty"`
	Metadata       map[string]any   `json:"metadata,omitempty"`
	Calendar       bool             `json:"calendar,omitempty"`
	Shards         uint32           `json:"shards,omitempty"`
	Lease          bool             `json:"lease,omitempty"`
	Consistency    string           `json:"consistency,omitempty"`
	OnLimit        *onLimitJSON     `json:"on_limit,omitempty"`
	Descriptors    []descriptorJSON `json:"descriptors,omitempty"`
}

type rateLimitJSON struct {
	Unit            string   `json:"unit,omitempty"`
	RequestsPerUnit uint32   `json:"requests_per_unit,omitempty"`
	UnitMultiplier  uint32   `json:"unit_multiplier,omitempty"`
	Unlimited       bool     `json:"unlimited,omitempty"`
	Name            string   `json:"name,omitempty"`
	Replaces        []string `json:"replaces,omitempty"`
}

func domainConfig(d *rules.Domain) domainJSON {
	out := domainJSON{Domain: d.Name, DefaultAlgorithm: string(d.DefaultAlgorithm), Descriptors: descriptorsJSON(d.Descriptors)}
	for _, rd := range d.RequestDescriptors {
		entries := make([]requestEntryJSON, len(rd.Entries))
		for i, e := range rd.Entries {
			entries[i] = requestEntryJSON{Key: e.Key, From: string(e.From), Name: e.Name, Value: e.Value}
		}
		out.RequestDescriptors = append(out.RequestDescriptors, requestDescriptorJSON{Entries: entries})
	}
	return out
}

func descriptorsJSON(ds []rules.Descriptor) []descriptorJSON {
	out := make([]descriptorJSON, len(ds))
	for i, d := range ds {
		out[i] = descriptorJSON{Key: d.Key, Value: d.Value, Algorithm: string(d.Algorithm), Burst: d.Burst,
			ShadowMode: d.ShadowMode, DetailedMetric: d.DetailedMetric, FailureMode: string(d.FailureMode),
			ValueToMetric: d.ValueToMetric, ShareThreshold: d.ShareThreshold, Metadata: d.Metadata, Calendar: d.Calendar, Shards: d.Shards,
			Lease: d.Lease, Consistency: string(d.Consistency), OnLimit: onLimit(d.OnLimit)}
		if rl := d.RateLimit; rl != nil {
			out[i].RateLimit = &rateLimitJSON{Unit: string(rl.Unit), RequestsPerUnit: rl.RequestsPerUnit, UnitMultiplier: rl.UnitMultiplier,
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
	Path            string       `json:"path"`
	Name            string       `json:"name"` // rate_limit.name, else Path
	Unit            string       `json:"unit,omitempty"`
	RequestsPerUnit uint32       `json:"requests_per_unit"`
	UnitMultiplier  uint32       `json:"unit_multiplier,omitempty"` // when more than 1
	Burst           uint32       `json:"burst"`
	Algorithm       string       `json:"algorithm"`
	Unlimited       bool         `json:"unlimited"`
	ShadowMode      bool         `json:"shadow_mode"`
	DetailedMetric  bool         `json:"detailed_metric"`
	FailureMode     string       `json:"failure_mode"`
	Calendar        bool         `json:"calendar"`
	Shards          uint32       `json:"shards"`
	Lease           bool         `json:"lease"`
	Consistency     string       `json:"consistency"`
	OnLimit         *onLimitJSON `json:"on_limit,omitempty"`
	Replaces        []string     `json:"replaces,omitempty"`
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

// limitOf is desc's limit, at path, with the defaults the enforcer applies;
// def is the domain's default_algorithm.
func limitOf(desc rules.Descriptor, def rules.Algorithm, path string) limitJSON {
	rl := desc.RateLimit
	l := limitJSON{Path: path, Name: cmp.Or(rl.Name, path), RequestsPerUnit: rl.RequestsPerUnit,
		Burst: cmp.Or(desc.Burst, rl.RequestsPerUnit), Algorithm: string(cmp.Or(desc.Algorithm, def, rules.TokenBucket)),
		Unlimited: rl.Unlimited, ShadowMode: desc.ShadowMode, DetailedMetric: desc.DetailedMetric,
		FailureMode: string(cmp.Or(desc.FailureMode, rules.FailOpen)), Calendar: desc.Calendar,
		Shards: max(desc.Shards, 1), Lease: desc.Lease, Consistency: string(cmp.Or(desc.Consistency, rules.Exact)),
		OnLimit: onLimit(desc.OnLimit), Replaces: rl.Replaces}
	if !rl.Unlimited {
		l.Unit = string(rl.Unit)
		if rl.UnitMultiplier > 1 {
			l.UnitMultiplier = rl.UnitMultiplier
		}
	}
	return l
}

// entryJSON is one level of a limit's descriptor path.
type entryJSON struct {
	Key   string `json:"key"`
	Value string `json:"value,omitempty"`
}

// pathLimit is a limit with the descriptor path that leads to it.
type pathLimit struct {
	path  []entryJSON
	limit limitJSON
}

func pathLimits(d *rules.Domain) []pathLimit {
	var out []pathLimit
	var walk func(ds []rules.Descriptor, path []entryJSON)
	walk = func(ds []rules.Descriptor, path []entryJSON) {
		for _, desc := range ds {
			p := append(path[:len(path):len(path)], entryJSON{Key: desc.Key, Value: desc.Value})
			if desc.RateLimit != nil {
				out = append(out, pathLimit{p, limitOf(desc, d.DefaultAlgorithm, pathName(p))})
			}
			walk(desc.Descriptors, p)
		}
	}
	walk(d.Descriptors, nil)
	return out
}

// pathName is Lyft's name for a descriptor path: key or key_value per
// level, joined by ".".
func pathName(p []entryJSON) string {
	parts := make([]string, len(p))
	for i, e := range p {
		parts[i] = e.Key
		if e.Value != "" {
			parts[i] += "_" + e.Value
		}
	}
	return strings.Join(parts, ".")
}
