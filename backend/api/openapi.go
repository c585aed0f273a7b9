package api

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"github.com/sluicehq/sluice/rules"
	"net/http"

	"github.com/gin-gonic/gin"
	"gopkg.in/yaml.v3"
)

// openAPIYAML is the hand-written OpenAPI 3 document of this API. A test
// fails when a route is missing from it or it lists a route that does not
// exist.
//
//go:embed openapi.yaml
var openAPIYAML []byte

// openAPIJSON is openAPIYAML as JSON, converted once.
var openAPIJSON, openAPIErr = toJSON(openAPIYAML)

func toJSON(src []byte) ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, fmt.Errorf("parse openapi.yaml: %w", err)
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("convert openapi.yaml to JSON: %w", err)
	}
	return out, nil
}

// OpenAPI returns the OpenAPI document (YAML) this API implements: the one
// definition that the docs, the UI's and the CLI's types and the tests'
// answer checks all derive from.
func OpenAPI() []byte { return bytes.Clone(openAPIYAML) }

func (a *API) getOpenAPI(c *gin.Context) error {
	if openAPIErr != nil {
		return openAPIErr
	}
	c.Data(http.StatusOK, "application/json", a.openapi)
	return nil
}

// getSchema serves the JSON Schema of the rule format, for editors and the
// UI's autocompletion. It is generated from the rules package's field table.
func getSchema(c *gin.Context) {
	c.Data(http.StatusOK, "application/schema+json", rules.JSONSchema())
}
