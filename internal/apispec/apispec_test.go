package apispec

import (
	"slices"
	"testing"
)

const doc = `
openapi: 3.0.3
info: {title: t, version: "1"}
paths: {}
components:
  schemas:
    Plain:
      type: object
      properties: {a: {type: string}, b: {type: integer}}
    Listed:
      type: object
      required: [a]
      properties: {a: {type: string}, b: {type: integer}}
    None:
      type: object
      required: []
      properties: {a: {type: string}}
    Open:
      type: object
      additionalProperties: true
      properties: {a: {type: string}}
    Both:
      allOf:
        - $ref: "#/components/schemas/Plain"
        - type: object
          required: []
          properties: {c: {type: boolean}}
    Ref:
      type: object
      properties:
        plain: {allOf: [{$ref: "#/components/schemas/Plain"}], nullable: true}
`

func TestLoadReadsTheDocumentStrictly(t *testing.T) {
	t.Parallel()
	d, err := Load([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	s := d.Components.Schemas
	for _, tt := range []struct {
		name     string
		required []string
		closed   bool
	}{
		{"Plain", []string{"a", "b"}, true},
		{"Listed", []string{"a"}, true},
		{"None", []string{}, true},
		{"Open", []string{"a"}, false},
		{"Both", []string{"a", "b"}, true},
	} {
		v := s[tt.name].Value
		if !slices.Equal(v.Required, tt.required) {
			t.Errorf("%s: required %q, want %q", tt.name, v.Required, tt.required)
		}
		closed := v.AdditionalProperties.Has != nil && !*v.AdditionalProperties.Has
		if closed != tt.closed {
			t.Errorf("%s: closed %v, want %v", tt.name, closed, tt.closed)
		}
	}
	if both := s["Both"].Value; len(both.AllOf) != 0 || len(both.Properties) != 3 {
		t.Errorf("Both: allOf %d, properties %d; want the members merged into 3 properties", len(both.AllOf), len(both.Properties))
	}
	// A nullable reference keeps naming its type, and the type is strict.
	ref := s["Ref"].Value.Properties["plain"].Value
	if len(ref.AllOf) != 1 || ref.AllOf[0].Ref != "#/components/schemas/Plain" || !ref.Nullable {
		t.Fatalf("Ref.plain = %+v, want the nullable reference kept", ref)
	}
	if got := ref.AllOf[0].Value.Required; !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Ref.plain's Plain requires %q, want a and b", got)
	}
	// Strict: a value without b, or with a field Plain does not name, fails.
	for _, tt := range []struct {
		value map[string]any
		ok    bool
	}{
		{map[string]any{"a": "x", "b": 1.0}, true},
		{map[string]any{"a": "x"}, false},
		{map[string]any{"a": "x", "b": 1.0, "c": 2.0}, false},
	} {
		if err := s["Plain"].Value.VisitJSON(tt.value); (err == nil) != tt.ok {
			t.Errorf("Plain %v: %v, want ok %v", tt.value, err, tt.ok)
		}
	}
}

func TestLoadRefusesBrokenDocuments(t *testing.T) {
	t.Parallel()
	for _, src := range []string{"paths: [", "openapi: 3.0.3\ninfo: {title: t, version: '1'}\npaths: {/x: {get: {responses: {'200': {$ref: '#/components/responses/nope'}}}}}"} {
		if _, err := Load([]byte(src)); err == nil {
			t.Errorf("Load accepted %q", src)
		}
	}
}
