package rules

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func loadSchema(t *testing.T) map[string]any {
	t.Helper()
	var schema map[string]any
	if err := json.Unmarshal(JSONSchema(), &schema); err != nil {
		t.Fatalf("JSONSchema is not JSON: %v", err)
	}
	return schema
}

// TestJSONSchemaCoversFormat fails when a field the parser knows is missing
// from the schema, or the schema has one the parser does not know: every
// key Format writes for a domain that sets every field must be a property
// of the schema at that place, and every property must be written.
func TestJSONSchemaCoversFormat(t *testing.T) {
	t.Parallel()
	schema := loadSchema(t)
	if got := schema["$schema"]; got != "https://json-schema.org/draft/2020-12/schema" {
		t.Errorf("$schema = %v", got)
	}
	src, err := os.ReadFile("testdata/valid/sluice_all.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d, err := Parse("sluice_all.yaml", src)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(Format(d), &doc); err != nil {
		t.Fatal(err)
	}
	written := map[string]map[string]bool{} // $defs name → keys written
	var walk func(v any, ref string)
	walk = func(v any, ref string) {
		def := schema["$defs"].(map[string]any)[ref].(map[string]any)
		props := def["properties"].(map[string]any)
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s: Format wrote %T", ref, v)
		}
		if written[ref] == nil {
			written[ref] = map[string]bool{}
		}
		for k, fv := range m {
			written[ref][k] = true
			p, ok := props[k].(map[string]any)
			if !ok {
				t.Errorf("the parser knows %s.%s; the schema does not", ref, k)
				continue
			}
			if r, ok := p["$ref"].(string); ok {
				walk(fv, strings.TrimPrefix(r, "#/$defs/"))
			}
			if items, ok := p["items"].(map[string]any); ok {
				for _, item := range fv.([]any) {
					walk(item, strings.TrimPrefix(items["$ref"].(string), "#/$defs/"))
				}
			}
		}
	}
	walk(doc, "domain")
	for name, def := range schema["$defs"].(map[string]any) {
		for prop := range def.(map[string]any)["properties"].(map[string]any) {
			if !written[name][prop] {
				t.Errorf("the schema has %s.%s; testdata/valid/sluice_all.yaml does not set it (or the parser does not know it)", name, prop)
			}
		}
	}
}

// TestJSONSchemaEnums checks the schema's value lists against the parser's.
func TestJSONSchemaEnums(t *testing.T) {
	t.Parallel()
	defs := loadSchema(t)["$defs"].(map[string]any)
	enum := func(def, prop string) []string {
		var out []string
		for _, v := range defs[def].(map[string]any)["properties"].(map[string]any)[prop].(map[string]any)["enum"].([]any) {
			out = append(out, v.(string))
		}
		return out
	}
	tests := []struct {
		def, prop string
		want      []string
	}{
		{"descriptor", "algorithm", strs(supportedAlgorithms)},
		{"descriptor", "failure_mode", strs(failureModes)},
		{"rate_limit", "unit", append(strs(units), strings.Split(strings.ToUpper(strings.Join(strs(units), ",")), ",")...)},
		{"on_limit", "action", strs(actions)},
		{"request_entry", "from", strs(sources)},
	}
	for _, tt := range tests {
		if got := enum(tt.def, tt.prop); !slices.Equal(got, tt.want) {
			t.Errorf("%s.%s enum = %q, want %q", tt.def, tt.prop, got, tt.want)
		}
	}
}

// TestJSONSchemaValidates runs every fixture through the schema: valid
// files must pass; the invalid files listed must fail (the schema cannot see
// everything Parse checks, such as duplicates or unknown replaces).
func TestJSONSchemaValidates(t *testing.T) {
	t.Parallel()
	schema := loadSchema(t)
	check := func(file string) []string {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := yaml.Unmarshal(src, &doc); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		return validateSchema(schema, schema, toJSON(doc), "")
	}
	valid, _ := filepath.Glob("testdata/valid/*.yaml")
	for _, f := range valid {
		if errs := check(f); len(errs) > 0 {
			t.Errorf("%s: the schema refuses a valid file:\n%s", f, strings.Join(errs, "\n"))
		}
	}
	for f, want := range map[string]string{
		"unknown_field_typo.yaml":      "reqests_per_unit: unknown property",
		"unknown_unit.yaml":            "unit: not one of",
		"on_limit.yaml":                "max_delay",
		"shards.yaml":                  "shards: more than 64",
		"request_descriptors.yaml":     "entries: fewer than 1 items",
		"missing_key.yaml":             "key: required",
		"requests_per_unit.yaml":       "requests_per_unit: less than 0",
		"extensions.yaml":              "algorithm: not one of",
		"unknown_field_misplaced.yaml": "unit: unknown property",
	} {
		errs := check(filepath.Join("testdata/invalid", f))
		if !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, want) }) {
			t.Errorf("%s: want a schema error with %q, got:\n%s", f, want, strings.Join(errs, "\n"))
		}
	}
}

// toJSON turns a YAML value into what encoding/json would decode the same
// document into.
func toJSON(v any) any {
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(v); err != nil {
		panic(err)
	}
	var out any
	if err := json.Unmarshal(b.Bytes(), &out); err != nil {
		panic(err)
	}
	return out
}

// validateSchema is a small JSON Schema validator for the keywords
// JSONSchema uses. It returns one message per failure, prefixed by path.
func validateSchema(root, s map[string]any, v any, path string) []string {
	var errs []string
	fail := func(format string, args ...any) {
		errs = append(errs, path+": "+fmt.Sprintf(format, args...))
	}
	if ref, ok := s["$ref"].(string); ok {
		def := root["$defs"].(map[string]any)[strings.TrimPrefix(ref, "#/$defs/")].(map[string]any)
		errs = append(errs, validateSchema(root, def, v, path)...)
	}
	if typ, ok := s["type"]; ok {
		var types []string
		switch typ := typ.(type) {
		case string:
			types = []string{typ}
		case []any:
			for _, x := range typ {
				types = append(types, x.(string))
			}
		}
		if !slices.ContainsFunc(types, func(t string) bool { return jsonType(v, t) }) {
			fail("not of type %v", types)
			return errs
		}
	}
	if enum, ok := s["enum"].([]any); ok && !slices.Contains(enum, v) {
		fail("not one of %v", enum)
	}
	if c, ok := s["const"]; ok && c != v {
		fail("not %v", c)
	}
	if n, ok := v.(float64); ok {
		if lo, ok := s["minimum"].(float64); ok && n < lo {
			fail("less than %v", lo)
		}
		if hi, ok := s["maximum"].(float64); ok && n > hi {
			fail("more than %v", hi)
		}
	}
	if str, ok := v.(string); ok {
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(str) {
			fail("does not match %s", p)
		}
		if n, ok := s["maxLength"].(float64); ok && float64(len([]rune(str))) > n {
			fail("longer than %v", n)
		}
		if n, ok := s["minLength"].(float64); ok && float64(len([]rune(str))) < n {
			fail("shorter than %v", n)
		}
	}
	if list, ok := v.([]any); ok {
		if items, ok := s["items"].(map[string]any); ok {
			for i, item := range list {
				errs = append(errs, validateSchema(root, items, item, fmt.Sprintf("%s[%d]", path, i))...)
			}
		}
		if n, ok := s["minItems"].(float64); ok && float64(len(list)) < n {
			fail("fewer than %v items", n)
		}
		if n, ok := s["maxItems"].(float64); ok && float64(len(list)) > n {
			fail("more than %v items", n)
		}
	}
	if obj, ok := v.(map[string]any); ok {
		props, _ := s["properties"].(map[string]any)
		for k, fv := range obj {
			p := strings.TrimPrefix(path+"."+k, ".")
			if ps, ok := props[k].(map[string]any); ok {
				errs = append(errs, validateSchema(root, ps, fv, p)...)
			} else if s["additionalProperties"] == false {
				errs = append(errs, p+": unknown property")
			}
		}
		if req, ok := s["required"].([]any); ok {
			for _, r := range req {
				if _, ok := obj[r.(string)]; !ok {
					errs = append(errs, strings.TrimPrefix(path+"."+r.(string), ".")+": required")
				}
			}
		}
	}
	if not, ok := s["not"].(map[string]any); ok && len(validateSchema(root, not, v, path)) == 0 {
		fail("must not match %v", not)
	}
	if anyOf, ok := s["anyOf"].([]any); ok {
		if !slices.ContainsFunc(anyOf, func(sub any) bool { return len(validateSchema(root, sub.(map[string]any), v, path)) == 0 }) {
			fail("matches none of anyOf")
		}
	}
	if oneOf, ok := s["oneOf"].([]any); ok {
		n := 0
		for _, sub := range oneOf {
			if len(validateSchema(root, sub.(map[string]any), v, path)) == 0 {
				n++
			}
		}
		if n != 1 {
			fail("matches %d of oneOf %v", n, oneOf)
		}
	}
	if cond, ok := s["if"].(map[string]any); ok {
		branch := "else"
		if len(validateSchema(root, cond, v, path)) == 0 {
			branch = "then"
		}
		if sub, ok := s[branch].(map[string]any); ok {
			errs = append(errs, validateSchema(root, sub, v, path)...)
		}
	}
	return errs
}

func jsonType(v any, typ string) bool {
	switch v := v.(type) {
	case string:
		return typ == "string"
	case bool:
		return typ == "boolean"
	case float64:
		return typ == "number" || typ == "integer" && v == math.Trunc(v)
	case []any:
		return typ == "array"
	case map[string]any:
		return typ == "object"
	case nil:
		return typ == "null"
	}
	return false
}
