package rules

import (
	"encoding/json"
	"strconv"
	"strings"
)

// The YAML format is described once, by the objects below: the parser takes
// the fields each mapping accepts from them, Format writes fields in their
// order, and JSONSchema is generated from them. A field added here and not
// decoded, or decoded and not added here, fails the tests.

// kind is the type of a field's value.
type kind int

const (
	textKind     kind = iota // text; a number or boolean is taken as written
	boolKind                 // true or false (YAML 1.1's yes/no/on/off too)
	intKind                  // a whole number from min to max
	enumKind                 // one of enum
	durationKind             // a Go duration such as 500ms or 2s
	objectKind               // a mapping, described by the object named ref
	anyMapKind               // a mapping of anything, kept as written
	listKind                 // a list of mappings, described by the object named ref
)

type field struct {
	name     string
	kind     kind
	doc      string
	enum     []string // enumKind
	min, max int64    // intKind
	ref      string   // objectKind, listKind
	required bool
	extra    map[string]any // further JSON Schema keywords
}

type object struct {
	name   string
	title  string
	doc    string
	fields []field
	extra  map[string]any // further JSON Schema keywords
}

var objects = []*object{
	{
		name:  "domain",
		title: "Domain",
		doc:   "One domain's rate limits: envoyproxy/ratelimit's configuration format plus Sluice's extensions.",
		fields: []field{
			{name: "domain", kind: textKind, required: true,
				doc:   "The domain's name, as clients send it in rate limit requests.",
				extra: map[string]any{"type": "string", "pattern": "^[A-Za-z0-9_.-]+$", "minLength": 1, "maxLength": maxDomainName}},
			{name: "default_algorithm", kind: enumKind, enum: strs(supportedAlgorithms),
				doc: "The algorithm of every limit in this domain that names none (default token_bucket). Lyft counts in fixed windows: fixed_window keeps its counting."},
			{name: "request_descriptors", kind: listKind, ref: "request_descriptor",
				doc: "How gateway mode builds a request's descriptors from an HTTP request, one item per descriptor."},
			{name: "descriptors", kind: listKind, ref: "descriptor",
				doc: "The descriptor tree: each request descriptor is matched down it, entry by entry."},
			{name: "overrides", kind: listKind, ref: "override",
				doc:   "Another rate for the request descriptors with exactly these entries: the limit they match, with its unit and requests_per_unit replaced. The console writes this section for its temporary overrides.",
				extra: map[string]any{"maxItems": MaxOverrides}},
		},
	},
	{
		name:  "descriptor",
		title: "Descriptor",
		doc:   "A node of the descriptor tree: it matches one entry of a request descriptor.",
		fields: []field{
			{name: "key", kind: textKind, required: true, doc: "The entry key this descriptor matches."},
			{name: "value", kind: textKind,
				doc: "The entry value this descriptor matches. Without it, any value matches and each value gets its own counter; in a value, each * stands for any run of characters (none included), so files/* matches every value with that prefix and /api*v1 every value with that prefix and suffix. An exact value wins over a wildcard (of several matching wildcards, the one with the most characters besides *, then the first), which wins over no value."},
			{name: "rate_limit", kind: objectKind, ref: "rate_limit",
				doc: "The limit of a request descriptor whose last entry lands here. Without it, such a request has no limit."},
			{name: "shadow_mode", kind: boolKind, doc: "Count and report, but never reject."},
			{name: "detailed_metric", kind: boolKind, doc: "Report metrics per request value, not only per descriptor."},
			{name: "value_to_metric", kind: boolKind, doc: "Put the request's value of this level in metric names."},
			{name: "share_threshold", kind: boolKind,
				doc: "For a wildcard value (with a *): all matching values share one counter instead of one each."},
			{name: "metadata", kind: anyMapKind,
				doc: "Lyft's descriptor metadata: any mapping, kept with the rules and not used by Sluice."},
			{name: "algorithm", kind: enumKind, enum: strs(supportedAlgorithms),
				doc: "How requests are counted (default: the domain's default_algorithm, else token_bucket). sliding_window_log is exact but keeps an entry per request: at most " +
					strconv.Itoa(MaxSlidingLogRequests) + " requests_per_unit per key (per shard, with shards)."},
			{name: "burst", kind: intKind, min: 1, max: MaxRequestsPerUnit,
				doc: "Capacity of a token or leaky bucket (default requests_per_unit)."},
			{name: "calendar", kind: boolKind,
				doc: "fixed_window only: count days, weeks, months and years in UTC calendar windows (a month resets on the 1st) instead of rolling periods."},
			{name: "shards", kind: intKind, min: 1, max: MaxShards,
				doc: "Spread this limit's hot counters over this many store keys (default 1)."},
			{name: "lease", kind: boolKind,
				doc: "Let enforcers take part of a hot limit's remaining quota and decide locally until it is spent (not for sliding_window_log)."},
			{name: "consistency", kind: enumKind, enum: strs(consistencies),
				doc: "exact (default) asks the counter store on every check; async decides from the node's counts, sends them to the store every flush interval and asks the store again near the limit (a small, stated overshoot; never under the limit)."},
			{name: "scope", kind: enumKind, enum: strs(scopes),
				doc: "Where the limit holds when enforcers run in several regions: region (default) in each region on its own, global across all of them (fixed_window and sliding_window_counter only)."},
			{name: "failure_mode", kind: enumKind, enum: strs(failureModes),
				doc: "The answer when the counter store is unreachable: open allows (default), closed rejects, local counts in the node's memory."},
			{name: "on_limit", kind: objectKind, ref: "on_limit", doc: "What happens to a request over the limit (default: reject with 429)."},
			{name: "descriptors", kind: listKind, ref: "descriptor", doc: "Descriptors for the next entry of a request descriptor."},
		},
	},
	{
		name:  "rate_limit",
		title: "Rate limit",
		doc:   "A limit: requests_per_unit requests per unit, or unlimited.",
		fields: []field{
			{name: "unit", kind: enumKind, enum: unitNames(),
				doc: "The period requests are counted over (case-insensitive)."},
			{name: "requests_per_unit", kind: intKind, min: 0, max: MaxRequestsPerUnit,
				doc: "Requests allowed per unit; 0 rejects every request."},
			{name: "unit_multiplier", kind: intKind, min: 1, max: MaxUnitMultiplier,
				doc: "The period is this many units (default 1): unit minute with unit_multiplier 5 counts requests_per_unit per 5 minutes. At most a year."},
			{name: "unlimited", kind: boolKind, doc: "No limit: matched and reported, never counted."},
			{name: "name", kind: textKind,
				doc: "The limit's name in metrics, headers and replaces (default: the descriptor path, like key_value.key)."},
			{name: "replaces", kind: listKind, ref: "replaces",
				doc: "Limits this one replaces: when both apply to a request, only this one does."},
		},
		extra: map[string]any{
			"if":   map[string]any{"properties": map[string]any{"unlimited": map[string]any{"const": true}}, "required": []string{"unlimited"}},
			"then": map[string]any{"not": map[string]any{"anyOf": []any{map[string]any{"required": []string{"unit"}}, map[string]any{"required": []string{"requests_per_unit"}}, map[string]any{"required": []string{"unit_multiplier"}}}}},
			"else": map[string]any{"required": []string{"unit", "requests_per_unit"}},
		},
	},
	{
		name:   "replaces",
		title:  "Replaced limit",
		doc:    "A limit that this one replaces.",
		fields: []field{{name: "name", kind: textKind, required: true, doc: "The replaced limit's name."}},
	},
	{
		name:  "on_limit",
		title: "On limit",
		doc:   "What happens to a request over its limit.",
		fields: []field{
			{name: "action", kind: enumKind, enum: strs(actions),
				doc: "reject (default) answers at once; delay holds the request until the bucket lets it through (token_bucket and leaky_bucket only)."},
			{name: "max_delay", kind: durationKind,
				doc: "delay only, and required with it: the longest a request is held (at most 1m); a request that would wait longer is rejected."},
			{name: "status", kind: intKind, min: 400, max: 599, doc: "HTTP status of a rejection (default 429)."},
		},
		extra: map[string]any{
			"if":   map[string]any{"properties": map[string]any{"action": map[string]any{"const": string(Delay)}}, "required": []string{"action"}},
			"then": map[string]any{"required": []string{"max_delay"}},
			"else": map[string]any{"not": map[string]any{"required": []string{"max_delay"}}},
		},
	},
	{
		name:  "override",
		title: "Override",
		doc:   "Another rate for one request descriptor: every other setting of the limit it matches stays.",
		fields: []field{
			{name: "entries", kind: listKind, ref: "override_entry", required: true,
				doc: "The request descriptor's entries, in order; it must match a limit.", extra: map[string]any{"minItems": 1, "maxItems": MaxDepth}},
			{name: "rate_limit", kind: objectKind, ref: "override_rate_limit", required: true,
				doc: "The rate those requests get instead of the matched limit's (burst: requests_per_unit)."},
		},
	},
	{
		name:  "override_entry",
		title: "Override entry",
		doc:   "One entry of an overridden request descriptor: a key and its exact value.",
		fields: []field{
			{name: "key", kind: textKind, required: true, doc: "The entry key."},
			{name: "value", kind: textKind, required: true, doc: "The exact value (a * here is a plain character)."},
		},
	},
	{
		name:  "override_rate_limit",
		title: "Override rate",
		doc:   "requests_per_unit requests per unit.",
		fields: []field{
			{name: "unit", kind: enumKind, enum: unitNames(), required: true,
				doc: "The period requests are counted over (case-insensitive)."},
			{name: "requests_per_unit", kind: intKind, min: 0, max: MaxRequestsPerUnit, required: true,
				doc: "Requests allowed per unit; 0 rejects every request."},
		},
	},
	{
		name:  "request_descriptor",
		title: "Request descriptor",
		doc:   "One descriptor gateway mode builds for each request; skipped when a source is missing.",
		fields: []field{
			{name: "entries", kind: listKind, ref: "request_entry", required: true,
				doc: "The descriptor's entries, in order.", extra: map[string]any{"minItems": 1, "maxItems": MaxDepth}},
		},
	},
	{
		name:  "request_entry",
		title: "Request descriptor entry",
		doc:   "One entry: its key, and where its value comes from (from) or a fixed value (value).",
		fields: []field{
			{name: "key", kind: textKind, required: true, doc: "The entry key."},
			{name: "from", kind: enumKind, enum: strs(sources), doc: "Where the value comes from."},
			{name: "name", kind: textKind, doc: "The header or query parameter (from: header or query)."},
			{name: "value", kind: textKind, doc: "A fixed value, instead of from."},
		},
		extra: map[string]any{
			"oneOf": []any{map[string]any{"required": []string{"from"}}, map[string]any{"required": []string{"value"}}},
			"if": map[string]any{
				"properties": map[string]any{"from": map[string]any{"enum": []string{string(FromHeader), string(FromQuery)}}},
				"required":   []string{"from"},
			},
			"then": map[string]any{"required": []string{"name"}},
			"else": map[string]any{"not": map[string]any{"required": []string{"name"}}},
		},
	},
}

// objectNamed returns the object called name.
func objectNamed(name string) *object {
	for _, o := range objects {
		if o.name == name {
			return o
		}
	}
	return nil
}

// fieldNames returns the field names of the object called name, in order.
func fieldNames(name string) []string {
	o := objectNamed(name)
	names := make([]string, len(o.fields))
	for i, f := range o.fields {
		names[i] = f.name
	}
	return names
}

// IsFieldName reports whether name is a field name of the rules' YAML, in
// any of its mappings ("descriptors", "rate_limit", "requests_per_unit").
// Whoever shows a Problem without the file's text keeps the path segments
// that are field names (the rest, such as an unknown field's, are the
// file's own).
func IsFieldName(name string) bool {
	for _, o := range objects {
		for _, f := range o.fields {
			if f.name == name {
				return true
			}
		}
	}
	return false
}

func strs[T ~string](values []T) []string {
	s := make([]string, len(values))
	for i, v := range values {
		s[i] = string(v)
	}
	return s
}

// unitNames lists the units in lower case, then in Lyft's upper case: the
// parser takes any case, and editors should offer the usual two.
func unitNames() []string {
	names := strs(units)
	for _, u := range units {
		names = append(names, strings.ToUpper(string(u)))
	}
	return names
}

// durationPattern matches what time.ParseDuration accepts, signs aside.
const durationPattern = `^([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))*$`

// SchemaID is the $id of JSONSchema's document.
const SchemaID = "https://sluicehq.github.io/sluice/schema/rules.json"

// JSONSchema returns a JSON Schema (draft 2020-12) of one domain's YAML, for
// editors and the console's editor to validate and complete with. The schema
// checks shape, types, enums and ranges; Parse checks the rest (duplicates,
// replaces, options that make no sense together) and has the last word.
func JSONSchema() []byte {
	defs := make(map[string]any, len(objects))
	for _, o := range objects {
		defs[o.name] = objectSchema(o)
	}
	doc := map[string]any{
		"$schema":     "https://json-schema.org/draft/2020-12/schema",
		"$id":         SchemaID,
		"title":       "Sluice rules",
		"description": objectNamed("domain").doc,
		"$ref":        "#/$defs/domain",
		"$defs":       defs,
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		// Only plain maps, slices, strings and numbers are marshalled.
		return nil
	}
	return append(out, '\n')
}

func objectSchema(o *object) map[string]any {
	props := make(map[string]any, len(o.fields))
	var required []string
	for _, f := range o.fields {
		props[f.name] = fieldSchema(f)
		if f.required {
			required = append(required, f.name)
		}
	}
	s := map[string]any{
		"title":                o.title,
		"description":          o.doc,
		"type":                 "object",
		"properties":           props,
		"additionalProperties": false,
	}
	if required != nil {
		s["required"] = required
	}
	for k, v := range o.extra {
		s[k] = v
	}
	return s
}

func fieldSchema(f field) map[string]any {
	s := map[string]any{"description": f.doc}
	switch f.kind {
	case textKind:
		s["type"] = []string{"string", "number", "boolean"}
	case boolKind:
		s["type"] = "boolean"
	case intKind:
		s["type"] = "integer"
		s["minimum"] = f.min
		s["maximum"] = f.max
	case enumKind:
		s["type"] = "string"
		s["enum"] = f.enum
	case durationKind:
		s["type"] = "string"
		s["pattern"] = durationPattern
	case objectKind:
		s["$ref"] = "#/$defs/" + f.ref
	case anyMapKind:
		s["type"] = "object"
	case listKind:
		s["type"] = "array"
		s["items"] = map[string]any{"$ref": "#/$defs/" + f.ref}
	}
	for k, v := range f.extra {
		s[k] = v
	}
	return s
}
