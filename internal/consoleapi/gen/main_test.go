package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestGeneratedUpToDate fails while api.gen.go is not what the OpenAPI
// document generates: the document is the one definition of the API.
func TestGeneratedUpToDate(t *testing.T) {
	src, err := os.ReadFile("../../../backend/api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, err := generate(src)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../api.gen.go")
	if err != nil {
		t.Fatalf("%v: run make generate", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("internal/consoleapi/api.gen.go is stale (first difference on line %d):\n got: %s\nwant: %s\nrun make generate", i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("internal/consoleapi/api.gen.go is stale (%d lines, want %d): run make generate", len(gl), len(wl))
	}
}

// TestGenerateRefusesBrokenDocuments: a document that does not load is an
// error, not an empty package.
func TestGenerateRefusesBrokenDocuments(t *testing.T) {
	for _, src := range []string{"paths: [", "openapi: 3.0.3\ninfo: {title: t, version: '1'}\npaths: {/x: {get: {responses: {'200': {$ref: '#/components/responses/nope'}}}}}"} {
		if _, err := generate([]byte(src)); err == nil {
			t.Errorf("generate accepted %q", src)
		}
	}
}
