// Package apidoc renders the console's OpenAPI document
// (backend/api/openapi.yaml, the one definition of the REST API) as the
// Markdown reference docs/api.md. `go generate ./internal/apidoc` rewrites
// docs/api.md; a test fails while the committed file differs from what
// Render makes of the OpenAPI file.
//
// Render knows the subset of OpenAPI 3.0 that file uses: tags, paths with
// path-level and operation-level parameters, request bodies and responses by
// value or by $ref, and schemas with properties, items, allOf, enum and
// additionalProperties. Operations are grouped by their first tag in the
// order of the document's tag list, and kept in the file's order within a
// tag; schemas keep the file's order.
package apidoc

//go:generate go run ./gen -o ../../docs/api.md ../../backend/api/openapi.yaml

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode"

	"gopkg.in/yaml.v3"
)

// ordered is a YAML mapping decoded with its keys in file order.
type ordered[T any] []entry[T]

type entry[T any] struct {
	Key   string
	Value T
}

func (o *ordered[T]) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: want a mapping", n.Line)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		var v T
		if err := n.Content[i+1].Decode(&v); err != nil {
			return err
		}
		*o = append(*o, entry[T]{Key: n.Content[i].Value, Value: v})
	}
	return nil
}

type document struct {
	Info struct {
		Title       string `yaml:"title"`
		Version     string `yaml:"version"`
		Description string `yaml:"description"`
	} `yaml:"info"`
	Tags []struct {
		Name        string `yaml:"name"`
		Description string `yaml:"description"`
	} `yaml:"tags"`
	Paths      ordered[pathItem] `yaml:"paths"`
	Components struct {
		SecuritySchemes ordered[struct {
			Description string `yaml:"description"`
		}] `yaml:"securitySchemes"`
		Parameters map[string]parameter `yaml:"parameters"`
		Responses  map[string]response  `yaml:"responses"`
		Schemas    ordered[*schema]     `yaml:"schemas"`
	} `yaml:"components"`
}

type pathItem struct {
	Parameters []parameter `yaml:"parameters"`
	Get        *operation  `yaml:"get"`
	Put        *operation  `yaml:"put"`
	Post       *operation  `yaml:"post"`
	Delete     *operation  `yaml:"delete"`
	Patch      *operation  `yaml:"patch"`
}

type operation struct {
	Tags        []string               `yaml:"tags"`
	Summary     string                 `yaml:"summary"`
	Description string                 `yaml:"description"`
	Security    *[]map[string][]string `yaml:"security"` // nil: the document's; empty: none
	Parameters  []parameter            `yaml:"parameters"`
	RequestBody *struct {
		Required bool               `yaml:"required"`
		Content  ordered[mediaType] `yaml:"content"`
	} `yaml:"requestBody"`
	Responses ordered[response] `yaml:"responses"`
}

type parameter struct {
	Ref         string  `yaml:"$ref"`
	Name        string  `yaml:"name"`
	In          string  `yaml:"in"`
	Description string  `yaml:"description"`
	Required    bool    `yaml:"required"`
	Schema      *schema `yaml:"schema"`
}

type response struct {
	Ref         string             `yaml:"$ref"`
	Description string             `yaml:"description"`
	Content     ordered[mediaType] `yaml:"content"`
	Headers     ordered[struct {
		Description string `yaml:"description"`
	}] `yaml:"headers"`
}

type mediaType struct {
	Schema *schema `yaml:"schema"`
}

type schema struct {
	Ref                  string           `yaml:"$ref"`
	Type                 string           `yaml:"type"`
	Format               string           `yaml:"format"`
	Description          string           `yaml:"description"`
	Enum                 []any            `yaml:"enum"`
	Default              any              `yaml:"default"`
	Example              any              `yaml:"example"`
	Nullable             bool             `yaml:"nullable"`
	Minimum              *float64         `yaml:"minimum"`
	Maximum              *float64         `yaml:"maximum"`
	MinLength            *int             `yaml:"minLength"`
	MaxLength            *int             `yaml:"maxLength"`
	Pattern              string           `yaml:"pattern"`
	Items                *schema          `yaml:"items"`
	Required             *[]string        `yaml:"required"` // nil: every property (see required)
	Properties           ordered[*schema] `yaml:"properties"`
	AllOf                []*schema        `yaml:"allOf"`
	AdditionalProperties yaml.Node        `yaml:"additionalProperties"`
}

// required reports whether property name must be present. An object
// without a required list requires every property, as internal/apispec
// reads the document for the generated clients and the API tests.
func (s *schema) required(name string) bool {
	return s.Required == nil || slices.Contains(*s.Required, name)
}

// additional returns the schema of a map's values, or nil.
func (s *schema) additional() *schema {
	if s.AdditionalProperties.Kind != yaml.MappingNode {
		return nil
	}
	var v schema
	if err := s.AdditionalProperties.Decode(&v); err != nil {
		return nil
	}
	return &v
}

// Slug is the anchor GitHub gives a Markdown heading: lower case, every
// character but letters, digits, spaces, '-' and '_' dropped, spaces made
// '-'. (A repeated heading gets "-1", "-2", ... appended; the caller counts.)
func Slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Render returns the Markdown reference of the OpenAPI document src.
func Render(src []byte) ([]byte, error) {
	var d document
	if err := yaml.Unmarshal(src, &d); err != nil {
		return nil, fmt.Errorf("parse OpenAPI document: %w", err)
	}
	r := &renderer{doc: &d, anchors: map[string]bool{}}
	if err := r.render(); err != nil {
		return nil, err
	}
	return r.out.Bytes(), nil
}

type renderer struct {
	doc     *document
	out     bytes.Buffer
	anchors map[string]bool
}

func (r *renderer) printf(format string, args ...any) { fmt.Fprintf(&r.out, format, args...) }

// heading writes a heading and refuses one whose anchor another has.
func (r *renderer) heading(level int, text string) error {
	a := Slug(text)
	if r.anchors[a] {
		return fmt.Errorf("two headings have the anchor #%s (%q)", a, text)
	}
	r.anchors[a] = true
	r.printf("%s %s\n\n", strings.Repeat("#", level), text)
	return nil
}

type op struct {
	method, path string
	item         *pathItem
	op           *operation
}

func (r *renderer) render() error {
	d := r.doc
	byTag := map[string][]op{}
	var untagged []op
	for i := range d.Paths {
		p := &d.Paths[i]
		for _, m := range []struct {
			name string
			op   *operation
		}{{"GET", p.Value.Get}, {"POST", p.Value.Post}, {"PUT", p.Value.Put}, {"PATCH", p.Value.Patch}, {"DELETE", p.Value.Delete}} {
			if m.op == nil {
				continue
			}
			o := op{m.name, p.Key, &p.Value, m.op}
			if len(m.op.Tags) == 0 {
				untagged = append(untagged, o)
				continue
			}
			byTag[m.op.Tags[0]] = append(byTag[m.op.Tags[0]], o)
		}
	}
	tags := make([]string, 0, len(d.Tags))
	for _, t := range d.Tags {
		tags = append(tags, t.Name)
	}
	var extra []string
	for t := range byTag {
		if !slices.Contains(tags, t) {
			extra = append(extra, t)
		}
	}
	sort.Strings(extra)
	tags = append(tags, extra...)
	if len(untagged) > 0 {
		tags = append(tags, "other")
		byTag["other"] = append(byTag["other"], untagged...)
	}

	title := "REST API"
	if d.Info.Title != "" {
		title = d.Info.Title
	}
	if err := r.heading(1, title); err != nil {
		return err
	}
	r.printf("<!-- Generated from backend/api/openapi.yaml by `go generate ./internal/apidoc`; do not edit. -->\n\n")
	if d.Info.Version != "" {
		r.printf("API version %s. The console serves the same document as JSON at `GET /api/v1/openapi.json`.\n\n", d.Info.Version)
	}
	if desc := strings.TrimSpace(d.Info.Description); desc != "" {
		r.printf("%s\n\n", desc)
	}
	if len(d.Components.SecuritySchemes) > 0 {
		r.printf("Credentials:\n\n")
		for _, s := range d.Components.SecuritySchemes {
			r.printf("- `%s`: %s\n", s.Key, oneLine(s.Value.Description))
		}
		r.printf("\n")
	}
	r.printf("Operations:\n\n")
	for _, t := range tags {
		if len(byTag[t]) == 0 {
			continue
		}
		r.printf("- **%s**:", t)
		for i, o := range byTag[t] {
			sep := ","
			if i == 0 {
				sep = ""
			}
			r.printf("%s [`%s %s`](#%s)", sep, o.method, o.path, Slug(o.method+" "+o.path))
		}
		r.printf("\n")
	}
	r.printf("- [Schemas](#schemas)\n\n")

	for _, t := range tags {
		if len(byTag[t]) == 0 {
			continue
		}
		if err := r.heading(2, t); err != nil {
			return err
		}
		for _, t2 := range d.Tags {
			if t2.Name == t && t2.Description != "" {
				r.printf("%s\n\n", strings.TrimSpace(t2.Description))
			}
		}
		for _, o := range byTag[t] {
			if err := r.operation(o); err != nil {
				return err
			}
		}
	}

	if err := r.heading(2, "Schemas"); err != nil {
		return err
	}
	for _, s := range d.Components.Schemas {
		if err := r.heading(3, s.Key); err != nil {
			return err
		}
		r.schemaBody(s.Value)
	}
	return nil
}

func (r *renderer) operation(o op) error {
	if err := r.heading(3, o.method+" "+o.path); err != nil {
		return err
	}
	if o.op.Summary != "" {
		r.printf("%s.\n\n", strings.TrimSuffix(o.op.Summary, "."))
	}
	if desc := strings.TrimSpace(o.op.Description); desc != "" {
		r.printf("%s\n\n", desc)
	}
	if o.op.Security != nil && len(*o.op.Security) == 0 {
		r.printf("No credentials needed.\n\n")
	}

	params := append(slices.Clone(o.item.Parameters), o.op.Parameters...)
	if len(params) > 0 {
		r.printf("| parameter | in | type | required | description |\n|---|---|---|---|---|\n")
		for _, p := range params {
			p, err := r.param(p)
			if err != nil {
				return fmt.Errorf("%s %s: %w", o.method, o.path, err)
			}
			r.printf("| `%s` | %s | %s | %s | %s |\n", p.Name, p.In, r.typeOf(p.Schema), yes(p.Required), cell(p.Description+constraints(p.Schema)))
		}
		r.printf("\n")
	}

	if rb := o.op.RequestBody; rb != nil {
		for _, c := range rb.Content {
			req := "optional"
			if rb.Required {
				req = "required"
			}
			r.printf("Request body (`%s`, %s): %s\n\n", c.Key, req, r.typeOf(c.Value.Schema))
			if s := c.Value.Schema; s != nil && s.Ref == "" && len(s.Properties) > 0 {
				r.properties(s)
			}
		}
	}

	if len(o.op.Responses) > 0 {
		r.printf("| status | meaning | body |\n|---|---|---|\n")
		var inline []entry[*schema]
		for _, e := range o.op.Responses {
			res, err := r.response(e.Value)
			if err != nil {
				return fmt.Errorf("%s %s %s: %w", o.method, o.path, e.Key, err)
			}
			var bodies []string
			for _, c := range res.Content {
				t := r.typeOf(c.Value.Schema)
				if c.Key != "application/json" {
					t += " (`" + c.Key + "`)"
				}
				bodies = append(bodies, t)
				if s := c.Value.Schema; s != nil && s.Ref == "" && len(s.Properties) > 0 {
					inline = append(inline, entry[*schema]{e.Key, s})
				}
			}
			desc := res.Description
			for _, h := range res.Headers {
				desc += fmt.Sprintf(" Header `%s`: %s", h.Key, h.Value.Description)
			}
			r.printf("| %s | %s | %s |\n", e.Key, cell(desc), strings.Join(bodies, ", "))
		}
		r.printf("\n")
		for _, e := range inline {
			r.printf("The %s body:\n\n", e.Key)
			r.properties(e.Value)
		}
	}
	return nil
}

func (r *renderer) param(p parameter) (parameter, error) {
	if p.Ref == "" {
		return p, nil
	}
	name := strings.TrimPrefix(p.Ref, "#/components/parameters/")
	q, ok := r.doc.Components.Parameters[name]
	if !ok {
		return p, fmt.Errorf("no parameter %s", p.Ref)
	}
	return q, nil
}

func (r *renderer) response(res response) (response, error) {
	if res.Ref == "" {
		return res, nil
	}
	name := strings.TrimPrefix(res.Ref, "#/components/responses/")
	q, ok := r.doc.Components.Responses[name]
	if !ok {
		return res, fmt.Errorf("no response %s", res.Ref)
	}
	return q, nil
}

// schemaBody describes a named schema: its description, then its fields.
func (r *renderer) schemaBody(s *schema) {
	if s.Description != "" {
		r.printf("%s\n\n", strings.TrimSpace(s.Description))
	}
	switch {
	case len(s.AllOf) > 0:
		var parts []string
		var own []*schema
		for _, p := range s.AllOf {
			if p.Ref != "" {
				parts = append(parts, r.typeOf(p))
			} else {
				own = append(own, p)
			}
		}
		r.printf("Every field of %s, and:\n\n", strings.Join(parts, ", "))
		for _, p := range own {
			r.properties(p)
		}
	case len(s.Properties) > 0:
		r.properties(s)
	default:
		r.printf("%s%s.\n\n", capitalize(r.typeOf(s)), constraints(s))
	}
}

func (r *renderer) properties(s *schema) {
	r.printf("| field | type | required | description |\n|---|---|---|---|\n")
	for _, p := range s.Properties {
		r.printf("| `%s` | %s | %s | %s |\n", p.Key, r.typeOf(p.Value), yes(s.required(p.Key)), cell(p.Value.Description+constraints(p.Value)))
	}
	r.printf("\n")
	if s.AdditionalProperties.Kind == yaml.ScalarNode && s.AdditionalProperties.Value == "false" {
		r.printf("Unknown fields are refused.\n\n")
	}
}

// typeOf is a schema's type in a few words, with named schemas linked.
func (r *renderer) typeOf(s *schema) string {
	if s == nil {
		return "any"
	}
	if s.Ref != "" {
		name := strings.TrimPrefix(s.Ref, "#/components/schemas/")
		return fmt.Sprintf("[%s](#%s)", name, Slug(name))
	}
	var t string
	switch {
	case len(s.AllOf) > 0:
		var parts []string
		for _, p := range s.AllOf {
			parts = append(parts, r.typeOf(p))
		}
		t = strings.Join(parts, " and ")
	case s.Type == "array":
		t = "array of " + r.typeOf(s.Items)
	case s.Type == "object" && s.additional() != nil:
		t = "map of string to " + r.typeOf(s.additional())
	case s.Type == "":
		t = "any"
	default:
		t = s.Type
		if s.Format != "" {
			t += " (" + s.Format + ")"
		}
	}
	if len(s.Enum) > 0 {
		var vs []string
		for _, v := range s.Enum {
			vs = append(vs, fmt.Sprintf("`%v`", v))
		}
		t += ": " + strings.Join(vs, ", ")
	}
	if s.Nullable {
		t += " or null"
	}
	return t
}

// constraints is a schema's bounds, default and example as a sentence
// suffix.
func constraints(s *schema) string {
	if s == nil {
		return ""
	}
	var cs []string
	if s.Minimum != nil {
		cs = append(cs, fmt.Sprintf("at least %v", *s.Minimum))
	}
	if s.Maximum != nil {
		cs = append(cs, fmt.Sprintf("at most %v", *s.Maximum))
	}
	if s.MinLength != nil {
		cs = append(cs, fmt.Sprintf("at least %d characters", *s.MinLength))
	}
	if s.MaxLength != nil {
		cs = append(cs, fmt.Sprintf("at most %d characters", *s.MaxLength))
	}
	if s.Pattern != "" {
		cs = append(cs, "matches `"+s.Pattern+"`")
	}
	if s.Default != nil {
		cs = append(cs, fmt.Sprintf("default `%v`", s.Default))
	}
	if s.Example != nil {
		cs = append(cs, fmt.Sprintf("e.g. `%v`", s.Example))
	}
	if len(cs) == 0 {
		return ""
	}
	return " (" + strings.Join(cs, "; ") + ")"
}

// cell makes text fit a table cell: one line, pipes escaped.
func cell(s string) string {
	return strings.ReplaceAll(oneLine(s), "|", `\|`)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func yes(b bool) string {
	if b {
		return "yes"
	}
	return ""
}

func capitalize(s string) string {
	if s == "" || s[0] == '[' {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
