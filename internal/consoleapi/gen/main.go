// Command gen writes the consoleapi package's types: oapi-codegen's models
// of the OpenAPI document, read as apispec reads it.
//
//	go run ./gen -o api.gen.go ../../backend/api/openapi.yaml
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/oapi-codegen/oapi-codegen/v2/pkg/codegen"

	"github.com/sluicehq/sluice/internal/apispec"
)

func main() {
	out := flag.String("o", "", "output file (default stdout)")
	flag.Parse()
	if err := run(flag.Arg(0), *out); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(specPath, outPath string) error {
	src, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	code, err := generate(src)
	if err != nil {
		return err
	}
	if outPath == "" {
		_, err = os.Stdout.Write(code)
		return err
	}
	return os.WriteFile(outPath, code, 0o644)
}

// generate returns the Go source of package consoleapi's types for the
// OpenAPI document src.
func generate(src []byte) ([]byte, error) {
	doc, err := apispec.Load(src)
	if err != nil {
		return nil, err
	}
	cfg := codegen.Configuration{
		PackageName: "consoleapi",
		Generate:    codegen.GenerateOptions{Models: true},
		OutputOptions: codegen.OutputOptions{
			// The cursor parameter and the Cursor schema share a name;
			// the parameter's type becomes CursorParameter.
			ResolveTypeNameCollisions: true,
			// Go's initialisms: ID, URL, YAML, not Id, Url, Yaml.
			NameNormalizer:        "ToCamelCaseWithInitialisms",
			AdditionalInitialisms: []string{"YAML", "CSRF", "OK"},
			// A list or map left out is an empty one.
			PreferSkipOptionalPointerOnContainerTypes: true,
		},
	}.UpdateDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	code, err := codegen.Generate(doc, cfg)
	if err != nil {
		return nil, fmt.Errorf("oapi-codegen: %w", err)
	}
	return []byte(code), nil
}
