package apidoc

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestAPIDocUpToDate fails while docs/api.md is not what the OpenAPI file
// renders to: the OpenAPI file is the one definition of the API.
func TestAPIDocUpToDate(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("../../backend/api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, err := Render(src)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatalf("%v: run go generate ./internal/apidoc", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("docs/api.md is stale (first difference on line %d):\n got: %s\nwant: %s\nrun go generate ./internal/apidoc", i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("docs/api.md is stale (%d lines, want %d): run go generate ./internal/apidoc", len(gl), len(wl))
	}
}

func TestRender(t *testing.T) {
	t.Parallel()
	src := []byte(`
openapi: 3.0.3
info: {title: T, version: "2", description: Intro.}
tags: [{name: b}, {name: a}]
paths:
  /x/{id}:
    parameters:
      - $ref: "#/components/parameters/id"
    put:
      tags: [a]
      summary: Put an x
      security: []
      requestBody:
        required: true
        content:
          application/json: {schema: {$ref: "#/components/schemas/X"}}
      responses:
        "200": {$ref: "#/components/responses/Ok"}
        "404": {description: "No | such x."}
  /y:
    get:
      tags: [b]
      summary: Get y
      responses:
        "200":
          description: The y.
          content:
            application/json:
              schema:
                type: object
                properties:
                  n: {type: integer, minimum: 1}
components:
  parameters:
    id: {name: id, in: path, required: true, schema: {type: integer}}
  responses:
    Ok: {description: Done., content: {application/json: {schema: {type: array, items: {$ref: "#/components/schemas/X"}}}}}
  schemas:
    Y: {type: object, required: [], properties: {q: {type: string}}}
    X:
      type: object
      required: [name]
      additionalProperties: false
      properties:
        name: {type: string, enum: [p, q]}
        tags: {type: object, additionalProperties: {type: string}}
`)
	md, err := Render(src)
	if err != nil {
		t.Fatal(err)
	}
	s := string(md)
	for _, want := range []string{
		"# T\n",
		"- **b**: [`GET /y`](#get-y)\n- **a**: [`PUT /x/{id}`](#put-xid)\n",
		"## b\n\n### GET /y\n",
		"### PUT /x/{id}\n\nPut an x.\n\nNo credentials needed.\n",
		"| `id` | path | integer | yes |  |",
		"Request body (`application/json`, required): [X](#x)",
		"| 200 | Done. | array of [X](#x) |",
		`| 404 | No \| such x. |  |`,
		"| `n` | integer | yes | (at least 1) |",
		"| `q` | string |  |  |",
		"| `name` | string: `p`, `q` | yes |  |",
		"| `tags` | map of string to string |  |  |",
		"Unknown fields are refused.",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("missing %q in\n%s", want, s)
		}
	}
	if strings.Index(s, "## b") > strings.Index(s, "## a") {
		t.Errorf("tags not in the document's order:\n%s", s)
	}
}

func TestRenderRefusesBrokenRefs(t *testing.T) {
	t.Parallel()
	for name, src := range map[string]string{
		"parameter": "paths: {/x: {get: {parameters: [{$ref: '#/components/parameters/nope'}]}}}",
		"response":  "paths: {/x: {get: {responses: {'200': {$ref: '#/components/responses/nope'}}}}}",
		"yaml":      "paths: [",
	} {
		if _, err := Render([]byte(src)); err == nil {
			t.Errorf("%s: Render accepted %s", name, src)
		}
	}
}

func TestSlug(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"GET /api/v1/users/{id}/role": "get-apiv1usersidrole",
		"Redis Cluster":               "redis-cluster",
		"`sluice ctl` (GitOps)":       "sluice-ctl-gitops",
		"Shadow mode_x":               "shadow-mode_x",
	} {
		if got := Slug(in); got != want {
			t.Errorf("Slug(%q) = %q, want %q", in, got, want)
		}
	}
}
